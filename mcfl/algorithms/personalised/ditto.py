"""Ditto (Li, Hu, Beirami and Smith, ICML 2021, "Ditto: Fair and Robust Federated Learning
Through Personalization"), Algorithm 1.

Two models per client round: the global model w is trained by FedAvg (the sampled clients train
it from w^t for E local epochs; the server takes their n_i-weighted mean), and each sampled
client k also trains its personal model v_k, for as many local steps, on its own objective
plus a pull toward the round's global model (Eq. 2):

    min_v  F_k(v) + (lambda / 2) ||v - w^t||^2.

lambda = 0 makes v_k a local model; large lambda brings it to w. Personal models start at W_0
(the global model's initialisation) and are rows of the run's client store
(`mcfl.algorithms.framework.stored`): on the device, in host memory or on disk. Each client is
evaluated with its personal model (the paper's personalised accuracy).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from mcfl.algorithms.framework.base import (
    ClientState,
    FederatedAlgorithm,
    RowModels,
    sampled,
    stack,
    training_key,
    training_metrics,
)
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import aggregate, global_start
from mcfl.engine import RoundClients, Start, train_and_collect
from mcfl.settings import setting


@dataclasses.dataclass(frozen=True)
class DittoParams:
    lam: float = setting(0.1, "lambda of Eq. 2: the personal model's pull toward the global "
                         "one (the paper tunes it per dataset; 0: local models)",
                         key="ditto_lambda", minimum=0)


@register("ditto", DittoParams, reference="Li et al., 2021, Ditto",
          summary="FedAvg on the global model w; each sampled client also trains its personal "
          "model on F_k(v) + (lambda/2)‖v − w‖² (Eq. 2); evaluated with the personal model")
def ditto(context: AlgorithmContext) -> FederatedAlgorithm:
    """Ditto; the state is (w, W_0), a client's row its personal model v_k (W_0 until it
    first trains). Its round is two trainings: the skeleton's stages for w (its messages go
    through the run's transform), then the personal models, which stay on the clients."""
    model = context.model

    def init(data, key, hp):
        del data, hp
        w0 = model.init(key)
        return w0, w0

    def fresh(state, clients):
        return stack(state[1], clients.shape[0])

    def round_(state, data, key, hp, exchange):
        w, w0 = state
        global_key, personal_key = jax.random.split(training_key(key))
        clients, rows = exchange.clients, exchange.rows
        size = clients.shape[0]
        zeros = jnp.zeros((size,), jnp.int32)
        samples = data.train_counts[clients]
        before = exchange  # (both trainings start from the clients' own layers as they were)
        summed, exchange = aggregate(context, global_start(w, clients, samples), data,
                                     global_key, hp, exchange)
        new_w = jax.tree.map(lambda m: m[0], summed.mean(stack(w)))
        # Personal models: row 1 + i of [w, v_1 .. v_S] starts client i, row 0 pulls it.
        models = jax.tree.map(lambda g, v: jnp.concatenate([g[None], v]), w, rows)
        personal, personal_stats, _ = train_and_collect(
            Start(models,
                  RoundClients(clients, 1 + jnp.arange(size, dtype=jnp.int32), anchor_index=zeros),
                  training=hp.training.replace(mu=hp.params.lam)),
            data, personal_key, exchange=before, sent=None, block_size=context.block_size)
        metrics = training_metrics(samples, summed.stats)
        metrics["personal_loss"] = training_metrics(samples, personal_stats)["train_loss"]
        return (new_w, w0), metrics, exchange.replace(rows=personal)

    def models(state, rows, clients):
        del state, clients
        return rows

    def client_models(state, data):  # personal models from the rows; a newcomer's starts at w
        del data
        return RowModels(newcomers=(stack(state[0]), None))

    return FederatedAlgorithm(init, sampled(context.clients_per_round), round_, client_models,
                              client_state=ClientState(fresh, models, context.store_dtype))
