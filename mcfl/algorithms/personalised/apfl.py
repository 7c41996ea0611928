"""APFL (Deng, Kamani and Mahdavi, 2020, "Adaptive Personalized Federated Learning"),
Algorithm 1 with the adaptive mixing weight of Eq. 10.

Each client keeps a local model v_i and a mixing weight alpha_i; its personalised model is the
mixture v_bar_i = alpha_i v_i + (1 - alpha_i) w. Every local step on a batch updates, from the
same batch,

    w     <- w - eta grad f_i(w)                       (the global model's copy)
    v_i   <- v_i - eta grad_v f_i(v_bar_i)             (= alpha_i grad f_i(v_bar_i))
    alpha <- alpha - eta <v_i - w, grad f_i(v_bar_i)>  (adaptive alpha, Eq. 10; clipped to [0, 1])

and the server averages the sampled clients' w (weighted by n_i, as FedAvg). This is one
objective of (w, v_i, alpha_i) for the engine's local training: f_i(w) + f_i(v_bar_i) with w
held fixed inside the mixture. Mixing weights start at `apfl_alpha`; with `apfl_adaptive` off
they stay there. A client's (v_i, alpha_i) are rows of the run's client store; v_i starts at
W_0. A client is evaluated with its mixture on the current global model, alpha_i v_i +
(1 - alpha_i) w (the paper mixes with the client's last local copy of w; between rounds that
is the global model it receives).
"""

from __future__ import annotations

import dataclasses

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
from mcfl.engine import RoundClients, Start, part_at, train_and_collect
from mcfl.engine.training import masked_cross_entropy
from mcfl.settings import setting


@dataclasses.dataclass(frozen=True)
class APFLParams:
    alpha: float = setting(0.25, "initial mixing weight alpha of the local model in the "
                           "personalised one", key="apfl_alpha", minimum=0, maximum=1)
    adaptive: bool = setting(True, "learn each client's alpha by gradient descent (Eq. 10); "
                             "off: alpha stays apfl_alpha", key="apfl_adaptive")


def mixture(v, w, alpha):
    """alpha v + (1 - alpha) w, leaf by leaf (alpha: a scalar or [b] per model of a stack)."""
    def mix(a, b):
        weight = jnp.reshape(alpha, jnp.shape(alpha) + (1,) * (a.ndim - jnp.ndim(alpha)))
        return weight * a + (1.0 - weight) * b

    return jax.tree.map(mix, v, w)


@register("apfl", APFLParams, reference="Deng et al., 2020, APFL",
          summary="clients train the global model and their own v_i on the mixture alpha_i v_i "
          "+ (1 - alpha_i) w, alpha_i learnt (Eq. 10); w averaged; evaluated with the mixture")
def apfl(context: AlgorithmContext) -> FederatedAlgorithm:
    """APFL; the state is (w, W_0), a client's row (v_i, alpha_i). A client's message is its
    copy of w (through the run's transform); v_i and alpha_i stay with it. The round is
    written here: one training of (w, v_i, alpha_i) together, the mean of the collected w."""
    model = context.model
    refuse_stateful(model, "apfl")

    def init(data, key, hp):
        del data
        w0 = model.init(key)
        return w0, (w0, jnp.asarray(hp.params.alpha, jnp.float32))

    def fresh(state, clients):
        w0, alpha = state[1]
        return stack(w0, clients.shape[0]), jnp.full(clients.shape, alpha, jnp.float32)

    def round_(state, data, key, hp, exchange):
        w = state[0]
        train_key = training_key(key)
        clients, rows = exchange.clients, exchange.rows
        size = clients.shape[0]
        adaptive = hp.params.adaptive

        def objective(p, xb, yb, mask):
            alpha = jnp.clip(p["alpha"], 0.0, 1.0)
            if not adaptive:
                alpha = jax.lax.stop_gradient(alpha)
            global_loss = masked_cross_entropy(model.apply(p["w"], xb), yb, mask)
            mixed = mixture(p["v"], jax.lax.stop_gradient(p["w"]), alpha)
            personal_loss = masked_cross_entropy(model.apply(mixed, xb), yb, mask)
            return global_loss + personal_loss, personal_loss

        start = {"w": stack(w, size), "v": rows[0], "alpha": rows[1]}
        training = hp.training.replace(objective=objective).per_client()
        trained, stats, exchange = train_and_collect(
            Start(start, RoundClients(clients, jnp.arange(size, dtype=jnp.int32)),
                  training=training),
            data, train_key, exchange=exchange, sent=part_at("w"), block_size=context.block_size)
        weights = data.train_counts[clients].astype(jnp.float32)
        new_w, exchange = weighted_mean_of(trained["w"], weights, exchange, w)
        new_rows = (trained["v"], jnp.clip(trained["alpha"], 0.0, 1.0))
        metrics = training_metrics(weights, stats)  # train_loss: the mixtures' loss
        metrics["alpha_mean"] = jnp.mean(new_rows[1])
        return (new_w, state[1]), metrics, exchange.replace(rows=new_rows)

    def models(state, rows, clients):
        del clients
        v, alpha = rows
        return mixture(v, stack(state[0], alpha.shape[0]), alpha)

    return FederatedAlgorithm(init, sampled(context.clients_per_round), round_, from_rows(),
                              client_state=ClientState(fresh, models, context.store_dtype))
