"""FedBN (Li et al., 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR): every client keeps its batch-norm layers (their running statistics and
their scale and bias) to itself; everything else is federated by the algorithm as usual.

`with_local_norm` wraps any algorithm whose clients train locally, as
`mcfl.algorithms.shift.with_shift` does: its state adds the clients' local parts [C, ...]
(`mcfl.models.spec.local_part`, initialised from the model each client would be evaluated
with). Each round hands them to local training (``LocalTraining.client_state``: a client's
own layers replace its start model's before it trains), and the trained clients' layers come
back through the round's metrics (`base.CLIENT_LOCAL`) into the state. A client is evaluated
with its model (its cluster's, or the global one) carrying its own layers, so evaluation
holds one model per client ([C, ...]).

What it does not reach: training outside a round's `training_metrics` (FeSEM's start, which
trains every client once, and FedGroup's pre-training) starts from the clients' local layers
but keeps their trained ones out of the state; IFCA picks clusters by the centres' losses with
the centres' own normalisation layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mcfl.algorithms.base import CLIENT_LOCAL, FederatedAlgorithm, wrapping
from mcfl.errors import ConfigError
from mcfl.models.spec import local_part, with_local_part


def _with_client_state(hp, local):
    return hp.replace(training=hp.training.replace(client_state=local))


def with_local_norm(algorithm: FederatedAlgorithm, collections: tuple[str, ...]
                    ) -> FederatedAlgorithm:
    """`algorithm` with each client's batch-norm layers kept local (FedBN)."""
    if not collections:
        raise ConfigError("bn=local keeps a model's batch-norm layers local (FedBN), but the "
                          "model has no mutable collections (no nn.BatchNorm); use bn=global")

    def own_models(state, num_clients):
        """Each client's model [C, ...] (index None: every client has model 0)."""
        models, index = algorithm.client_models(state)
        if index is None:
            index = jnp.zeros((num_clients,), jnp.int32)
        return jax.tree.map(lambda m: m[index], models)

    def clients_local(state, num_clients):
        own = own_models(state, num_clients)
        return jax.vmap(lambda model: local_part(model, collections))(own)

    def init(data, key, hp):
        inner = algorithm.init(data, key, hp)
        return inner, clients_local(inner, data.num_clients)

    def round_(state, data, key, hp):
        inner, local = state
        inner, metrics = algorithm.round(inner, data, key, _with_client_state(hp, local))
        if CLIENT_LOCAL not in metrics:
            raise ConfigError(f"bn=local needs an algorithm whose clients train locally; "
                              f"{algorithm.name!r} does not")
        clients, trained = metrics.pop(CLIENT_LOCAL)
        local = jax.tree.map(lambda old, new: old.at[clients].set(new), local, trained)
        return (inner, local), metrics

    def client_models(state):
        inner, local = state
        num_clients = jax.tree.leaves(local)[0].shape[0]
        own = own_models(inner, num_clients)
        return (jax.vmap(with_local_part)(own, local),
                jnp.arange(num_clients, dtype=jnp.int32))

    return wrapping(algorithm, init, round_, client_models)
