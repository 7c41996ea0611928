"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, ICML 2020, "SCAFFOLD:
Stochastic Controlled Averaging for Federated Learning"), Algorithm 1 with option II.

The server keeps the global model x and a control variate c; each client keeps its own control
variate c_i (zero until it first trains). A sampled client starts from x and corrects every
local gradient by the drift between the two variates:

    y_i <- y_i - eta_l (g_i(y_i) - c_i + c)                       (K_i local steps)
    c_i^+ = c_i - c + (x - y_i) / (K_i eta_l)                     (option II)

and the server moves by the mean of the sampled clients' changes (plain means over the round's
S clients, as in Algorithm 1; N clients in all):

    x <- x + eta_g (1/S) sum_i (y_i - x),   c <- c + (1/N) sum_i (c_i^+ - c_i).

K_i is the client's own step count (E epochs of ceil(n_i / B) steps). The clients' variates are
rows of the run's client store (`mcfl.algorithms.framework.stored`): on the device, in host memory
or on disk. Every client is evaluated with x. Each client receives and sends two model-sized trees
(x and c; y_i - x and c_i^+ - c_i), which the communication columns count.
"""

from __future__ import annotations

import dataclasses

import jax
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
from mcfl.algorithms.framework.skeleton import plain_mean_of, sum_of, transformed
from mcfl.engine import UPDATES, RoundClients, Start, train_and_collect
from mcfl.errors import ConfigError
from mcfl.settings import setting


@dataclasses.dataclass(frozen=True)
class ScaffoldParams:
    server_lr: float = setting(1.0, "server step toward the clients' average (1: plain "
                               "averaging; SCAFFOLD's eta_g)", above=0)

    def check(self, run) -> None:
        if run.training.optimizer != "sgd" or run.training.weight_decay != 0:
            raise ConfigError(
                f"scaffold's control variates (option II) assume plain local SGD; got "
                f"client_optimizer={run.training.optimizer}, "
                f"weight_decay={run.training.weight_decay}"
                f" (allowed: client_optimizer=sgd, weight_decay=0)")


def zeros_like_model(model_tree):
    return jax.tree.map(jnp.zeros_like, model_tree)


@register("scaffold", ScaffoldParams, reference="Karimireddy et al., 2020, SCAFFOLD",
          summary="clients train from the global model with gradients corrected by c - c_i "
          "(control variates); c_i updated by option II; the server averages the models and "
          "the variates' changes (Alg. 1)")
def scaffold(context: AlgorithmContext) -> FederatedAlgorithm:
    """SCAFFOLD; the state is (x, c), a client's row its c_i. A client's messages are y_i - x
    and c_i^+ - c_i, each through the run's transform; c_i^+ itself, computed from the client's
    own y_i, stays with it. The round is written here: the server needs both messages."""
    model = context.model

    def init(data, key, hp):
        del data, hp
        x = model.init(key)
        return x, zeros_like_model(x)

    def fresh(state, clients):
        return stack(zeros_like_model(state[1]), clients.shape[0])

    def round_(state, data, key, hp, exchange):
        x, c = state
        train_key = training_key(key)
        clients, rows = exchange.clients, exchange.rows
        size = clients.shape[0]
        correction = jax.tree.map(lambda cg, ci: cg[None] - ci, c, rows)  # c - c_i
        trained, stats, exchange = train_and_collect(
            Start(stack(x),
                  RoundClients(clients, jnp.zeros((size,), jnp.int32), correction=correction),
                  training=hp.training),
            data, train_key, exchange=exchange, sent=None, block_size=context.block_size)
        steps = stats.steps.astype(jnp.float32)
        scale = jnp.where(steps > 0, 1.0 / jnp.maximum(steps * hp.training.lr, 1e-30), 0.0)

        def variate(ci, cg, xg, y):  # option II; a client without steps keeps its c_i
            moved = ci - cg[None] + _per_client(scale, y) * (xg[None] - y)
            return jnp.where(_per_client(steps > 0, y), moved, ci)

        new_rows = jax.tree.map(variate, rows, c, x, trained)
        moves = transformed(exchange, jax.tree.map(lambda xg, y: y - xg[None], x, trained))
        changes = transformed(exchange, jax.tree.map(jnp.subtract, new_rows, rows))
        move, exchange = plain_mean_of(moves, exchange, UPDATES)
        change, exchange = sum_of(changes, exchange)
        new_x = jax.tree.map(lambda xg, u: xg + hp.params.server_lr * u, x, move)
        new_c = jax.tree.map(lambda cg, d: cg + d / data.num_clients, c, change)
        metrics = training_metrics(data.train_counts[clients], stats)
        metrics.update(models_down=2.0 * metrics["models_down"],  # x and c
                       models_up=2.0 * metrics["models_up"])  # y_i - x and c_i^+ - c_i
        return (new_x, new_c), metrics, exchange.replace(rows=new_rows)

    def models(state, rows, clients):
        del rows
        return stack(state[0], clients.shape[0])

    return FederatedAlgorithm(init, sampled(context.clients_per_round), round_, from_rows(),
                              client_state=ClientState(fresh, models, context.store_dtype))


def _per_client(values, like):
    """[S] `values` shaped to broadcast against a stacked leaf `like` [S, ...]."""
    return values.reshape((-1,) + (1,) * (like.ndim - 1))
