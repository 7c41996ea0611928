"""FedRep (Collins, Hassani, Mokhtari and Shakkottai, ICML 2021, "Exploiting Shared
Representations for Personalized Federated Learning"), Algorithm 1.

The model is a shared representation (the body: every layer but the last `fedrep_head_layers`)
and a head each client keeps. A sampled client first trains its head for `fedrep_head_epochs`
epochs with the round's body fixed, then the body for the run's local epochs (or steps) with
its new head fixed; the server averages the trained bodies (weighted by n_i, as FedAvg). Heads
start at W_0's and are rows of the run's client store. Each client is evaluated with the
body and its own head. Layers as in `mcfl.algorithms.personalised.partial`.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import jax
import jax.numpy as jnp

from mcfl.algorithms.framework.base import (
    ClientState,
    FederatedAlgorithm,
    from_rows,
    refuse_stateful,
    sampled,
    stack,
    training_key,
    training_metrics,
)
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import weighted_mean_of
from mcfl.algorithms.personalised.partial import joined, own_layers, split
from mcfl.engine import RoundClients, Start, part_at, train_and_collect
from mcfl.engine.training import masked_cross_entropy
from mcfl.errors import ConfigError
from mcfl.settings import Static, setting


@dataclasses.dataclass(frozen=True)
class FedRepParams:
    head_layers: int = setting(1, "the head: the model's last this many layers, each "
                               "client's own", key="fedrep_head_layers", minimum=1)
    head_epochs: Annotated[int, Static("sets the head's training loop: a shape")] = setting(
        10, "epochs a client trains its head (body fixed) before the body (the paper's "
        "tau_h: 10)", key="fedrep_head_epochs", minimum=1)

    def check(self, run) -> None:
        if run.training.weight_decay != 0:
            raise ConfigError(f"fedrep holds one part of the model fixed while the other "
                              f"trains, which weight decay would move; got weight_decay="
                              f"{run.training.weight_decay} (allowed: 0)")


@register("fedrep", FedRepParams, reference="Collins et al., 2021, FedRep",
          summary="clients train their own head (fedrep_head_epochs, body fixed), then the "
          "shared body (head fixed); bodies averaged; evaluated with body and own head")
def fedrep(context: AlgorithmContext) -> FederatedAlgorithm:
    """FedRep; the state is (body, W_0's head), a client's row its head. Its round is two
    trainings (the head, which stays with the client, then the body, the client's message
    through the run's transform), written here."""
    model = context.model
    refuse_stateful(model, "fedrep")

    def head_of(params):
        return own_layers(model, params.head_layers, True, "fedrep_head_layers",
                          "fedrep needs a model with a body and a head")

    def init(data, key, hp):
        del data
        return split(model.init(key), head_of(hp.params), ())

    def fresh(state, clients):
        return stack(state[1], clients.shape[0])

    def objective_training(training, train):
        """`training` on the whole model with only the part `train` ("body" or "head")
        moving."""
        def objective(p, xb, yb, mask):
            fixed = "head" if train == "body" else "body"
            parts = {train: p[train], fixed: jax.lax.stop_gradient(p[fixed])}
            loss = masked_cross_entropy(model.apply(joined(parts["body"], parts["head"], ()),
                                                    xb), yb, mask)
            return loss, loss

        return training.replace(objective=objective).per_client()

    def round_(state, data, key, hp, exchange):
        head_key, body_key = jax.random.split(training_key(key))
        clients, rows = exchange.clients, exchange.rows
        size = clients.shape[0]
        selection = RoundClients(clients, jnp.arange(size, dtype=jnp.int32))
        start = {"body": stack(state[0], size), "head": rows}
        head_training = hp.training.replace(local_epochs=hp.params.head_epochs,
                                            local_steps=None)
        heads, _, _ = train_and_collect(
            Start(start, selection, training=objective_training(head_training, "head")),
            data, head_key, block_size=context.block_size)
        trained, stats, exchange = train_and_collect(
            Start(heads, selection, training=objective_training(hp.training, "body")),
            data, body_key, exchange=exchange, sent=part_at("body"), block_size=context.block_size)
        weights = data.train_counts[clients].astype(jnp.float32)
        body, exchange = weighted_mean_of(trained["body"], weights, exchange, state[0])
        return ((body, state[1]), training_metrics(weights, stats),
                exchange.replace(rows=trained["head"]))

    def models(state, rows, clients):
        return joined(stack(state[0], clients.shape[0]), rows, ())

    return FederatedAlgorithm(init, sampled(context.clients_per_round), round_, from_rows(),
                              client_state=ClientState(fresh, models, context.store_dtype))
