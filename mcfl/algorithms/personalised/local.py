"""Local (NonFed): every client trains only on its own data and keeps its own model.

Each client's model is a row of the run's client store (`mcfl.algorithms.framework.stored`): on the
device ([C, ...] in the state), in host memory or on disk. Each round the sampled clients
continue training their own model; nothing is communicated. Evaluation uses each client's own
model.
"""

from __future__ import annotations

import jax.numpy as jnp

from mcfl.algorithms.framework.base import (
    ClientState,
    FederatedAlgorithm,
    from_rows,
    sampled,
    stack,
    training_key,
    training_metrics,
)
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.engine import RoundClients, Start, train_and_collect


@register("local", reference="NonFed baseline",
          summary="each client trains only its own model; evaluated with that model; nothing is "
          "sent")
def local(context: AlgorithmContext) -> FederatedAlgorithm:
    """Local training only. All clients start from the same initial model W_0 (the state; a
    client's row is its model). Nothing is sent, so no message goes through a transform."""
    model = context.model

    def init(data, key, hp):
        del data, hp
        return model.init(key)

    def fresh(w0, clients):
        return stack(w0, clients.shape[0])

    def round_(w0, data, key, hp, exchange):
        train_key = training_key(key)
        clients = exchange.clients
        positions = jnp.arange(clients.shape[0], dtype=jnp.int32)
        trained, stats, exchange = train_and_collect(
            Start(exchange.rows, RoundClients(clients, positions), training=hp.training),
            data, train_key, exchange=exchange, sent=None, block_size=context.block_size)
        metrics = training_metrics(data.train_counts[clients], stats)
        metrics.update(models_down=jnp.zeros(()), models_up=jnp.zeros(()))  # nothing is sent
        return w0, metrics, exchange.replace(rows=trained)

    def models(w0, rows, clients):
        del w0, clients
        return rows

    return FederatedAlgorithm(init, sampled(context.clients_per_round), round_, from_rows(),
                              client_state=ClientState(fresh, models, context.store_dtype))
