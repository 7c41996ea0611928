"""Local (NonFed): every client trains only on its own data and keeps its own model.

State holds all C client models stacked [C, ...]; each round the sampled clients continue
training their own model; nothing is communicated. Evaluation uses each client's own model.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.algorithms.base import FederatedAlgorithm, stack, training_metrics
from mcfl.algorithms.registry import AlgorithmContext, register
from mcfl.engine import RoundClients, train_and_collect
from mcfl.sampling import round_clients


class LocalState(flax.struct.PyTreeNode):
    params: object  # [C, ...]


@register("local", reference="NonFed baseline",
          summary="each client trains only its own model; evaluated with that model; nothing is "
          "sent")
def local(context: AlgorithmContext) -> FederatedAlgorithm:
    """Local training only. All clients start from the same initial model."""
    model, clients_per_round = context.model, context.clients_per_round

    def init(data, key, hp):
        del hp
        return LocalState(stack(model.init(key), data.num_clients))

    def round_(state, data, key, hp):
        sample_key, train_key = jax.random.split(key)
        clients = round_clients(data, sample_key, clients_per_round)
        trained, stats = train_and_collect(hp.training, data, train_key, state.params,
                                           RoundClients(clients, clients))
        params = jax.tree.map(lambda all_, new: all_.at[clients].set(new), state.params, trained)
        metrics = training_metrics(data.train_counts[clients], stats)
        metrics.update(models_down=jnp.zeros(()), models_up=jnp.zeros(()))  # nothing is sent
        return LocalState(params), metrics

    def client_models(state):
        num_clients = jax.tree.leaves(state.params)[0].shape[0]
        return state.params, jnp.arange(num_clients, dtype=jnp.int32)

    return FederatedAlgorithm("local", init, round_, client_models)
