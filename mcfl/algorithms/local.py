"""Local (NonFed): every client trains only on its own data and keeps its own model.

Each client's model is a row of the run's client store (`mcfl.algorithms.stored`): on the
device ([C, ...] in the state), in host memory or on disk. Each round the sampled clients
continue training their own model; nothing is communicated. Evaluation uses each client's own
model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mcfl.algorithms.base import FederatedAlgorithm, stack, training_metrics
from mcfl.algorithms.registry import AlgorithmContext, register
from mcfl.algorithms.stored import ClientRows, sampled_each_round, with_client_rows
from mcfl.engine import RoundClients, train_and_collect


@register("local", reference="NonFed baseline",
          summary="each client trains only its own model; evaluated with that model; nothing is "
          "sent")
def local(context: AlgorithmContext) -> FederatedAlgorithm:
    """Local training only. All clients start from the same initial model W_0 (the shared
    state; a client's row is its model)."""
    model, clients_per_round = context.model, context.clients_per_round

    def init_shared(data, key, hp):
        del data, hp
        return model.init(key)

    def fresh(w0, clients):
        return stack(w0, clients.shape[0])

    sample = sampled_each_round(clients_per_round)

    def round_(w0, rows, clients, data, key, hp):
        train_key = jax.random.split(key)[1]
        positions = jnp.arange(clients.shape[0], dtype=jnp.int32)
        trained, stats = train_and_collect(hp.training, data, train_key, rows,
                                           RoundClients(clients, positions))
        metrics = training_metrics(data.train_counts[clients], stats)
        metrics.update(models_down=jnp.zeros(()), models_up=jnp.zeros(()))  # nothing is sent
        return w0, trained, metrics

    def models(w0, rows, clients):
        del w0, clients
        return rows

    return with_client_rows("local", ClientRows(init_shared, fresh, sample, round_, models),
                            context.store_dtype)
