"""FedBN (Li et al., 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR): every client keeps its batch-norm layers (their running statistics and
their scale and bias) to itself; everything else is federated by the algorithm as usual.

`with_local_norm` wraps any algorithm whose clients train locally, as
`mcfl.algorithms.wrappers.shift.with_shift` does, by adding a row per client (`ClientState`): its
own normalisation layers (`mcfl.models.spec.local_part`; fresh: those of the model the client
would be evaluated with after `init`), beside the inner algorithm's own row when it keeps one.
So they live where the run's client store puts rows: on the device, in host memory or on
disk. A round hands the participants' layers to the inner round in its `Exchange`
(``exchange.norm_layers``): the engine puts a client's layers into its start model before it
trains and returns the trained ones, which become its row. A client is evaluated with its
model (its cluster's, or the global one) carrying its own layers.

What it does not reach: training of clients other than the round's participants (FeSEM's and
Robust's starts, FedGroup's cold start and its migrating clients, FL+HC's clustering round)
starts from the model's own layers and keeps nothing; IFCA picks clusters by the centres'
losses with the centres' own normalisation layers. The inner algorithm's client models must
not depend on the data (FedBN is applied before a shift's view).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mcfl.algorithms.framework.base import ClientState, FederatedAlgorithm, RowModels, SharedModels
from mcfl.errors import ConfigError
from mcfl.models.spec import local_part, with_local_part


def with_local_norm(algorithm: FederatedAlgorithm, collections: tuple[str, ...],
                    name: str = "the algorithm") -> FederatedAlgorithm:
    """`algorithm` (registered as `name`) with each client's batch-norm layers kept local
    (FedBN)."""
    if not collections:
        raise ConfigError("bn=local keeps a model's batch-norm layers local (FedBN), but the "
                          "model has no mutable collections (no nn.BatchNorm); use bn=global")
    inner = algorithm.client_state
    inner_rows = algorithm.rows

    def inner_models(state, rows, clients):
        """[b] the models the inner algorithm evaluates `clients` [b] with."""
        if inner_rows:
            return inner.models(state, rows, clients)
        described = algorithm.client_models(state, None)
        if not isinstance(described, SharedModels):  # (Per-FedAvg refuses batch norm)
            raise TypeError(f"bn=local keeps rows of shared models; {name!r} gives "
                            f"{type(described).__name__}")
        index = described.index
        row = (jnp.zeros_like(clients) if index is None else index[clients])
        return jax.tree.map(lambda m: m[row], described.models)

    def fresh(state, clients):
        rows = inner.fresh(state, clients) if inner_rows else None
        models = inner_models(state, rows, clients)
        return rows, jax.vmap(lambda model: local_part(model, collections))(models)

    def models(state, rows, clients):
        own, layers = rows
        return jax.vmap(with_local_part)(inner_models(state, own, clients), layers)

    def round_(state, data, key, hp, exchange):
        own, layers = exchange.rows
        state, metrics, exchange = algorithm.round(
            state, data, key, hp, exchange.replace(rows=own, norm_layers=layers))
        if not exchange.norm_trained:
            raise ConfigError(f"bn=local needs an algorithm whose clients train locally; "
                              f"{name!r} does not")
        return state, metrics, exchange.replace(rows=(exchange.rows, exchange.norm_layers),
                                                norm_layers=None, norm_trained=False)

    def client_models(state, data):
        """The rows' models now; the closing embedding trains a client from what the inner
        algorithm would have (its shared models, for one without rows)."""
        described = algorithm.client_models(state, data)
        return RowModels(apply=described.apply, data=described.data,
                         train_from=described.trains_from())

    client_state = ClientState(fresh, models, inner.dtype if inner else "float32",
                               inner.start if inner else None)
    return FederatedAlgorithm(algorithm.init, algorithm.participants, round_, client_models,
                              algorithm.assignments, client_state)
