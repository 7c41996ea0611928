"""pFedMe (Dinh, Tran and Nguyen, NeurIPS 2020, "Personalized Federated Learning with Moreau
Envelopes"), Algorithm 1.

Each client's personalised model theta_i is the proximal point of its loss around its local
copy w of the global model (Eq. 2-3). A sampled client starts the round with w and theta at
the global model and, for each local step on a batch D,

    theta <- approx. argmin_theta f_i(theta; D) + (lambda / 2) ||theta - w||^2
             (`pfedme_inner_steps` gradient steps of `pfedme_personal_lr` from theta)
    w     <- w - eta lambda (w - theta)                                        (Alg. 1)

and the server moves the global model by (1 - beta) w + beta * mean of the sampled clients' w
(plain mean, as Alg. 1). For the engine's local training this is one objective of (w, theta):
(lambda / 2) ||w - theta~||^2 + ||theta - theta~||^2 / (2 eta), theta~ the inner loop's result
held fixed, whose SGD step with rate eta is the update above (and sets theta to theta~).
Each client is evaluated with its personalised model theta_i after it last trained (W_0 before),
kept as a row of the run's client store.
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
from mcfl.algorithms.framework.skeleton import plain_mean_of
from mcfl.engine import RoundClients, Start, part_at, train_and_collect
from mcfl.engine.training import masked_cross_entropy, squared_distance
from mcfl.errors import ConfigError
from mcfl.settings import Static, setting


@dataclasses.dataclass(frozen=True)
class PFedMeParams:
    lam: float = setting(15.0, "lambda: the personalised model's pull to the local model "
                         "(the paper's MNIST setting: 15)", key="pfedme_lambda", above=0)
    personal_lr: float = setting(0.09, "learning rate of the inner steps that solve for theta "
                                 "(the paper's MNIST setting: 0.09)", key="pfedme_personal_lr",
                                 above=0)
    inner_steps: Annotated[int, Static("the inner loop's length: a shape")] = setting(
        5, "gradient steps solving for theta on each batch (the paper's K: 5)",
        key="pfedme_inner_steps", minimum=1)
    beta: float = setting(1.0, "server step: (1 - beta) w + beta * clients' mean (the "
                          "paper: 1 or 2)", key="pfedme_beta", above=0)

    def check(self, run) -> None:
        if run.training.optimizer != "sgd" or run.training.weight_decay != 0:
            raise ConfigError(
                f"pfedme's local update is plain SGD on w (Alg. 1); got client_optimizer="
                f"{run.training.optimizer}, weight_decay={run.training.weight_decay} (allowed: "
                f"client_optimizer=sgd, weight_decay=0)")


@register("pfedme", PFedMeParams, reference="Dinh et al., 2020, pFedMe",
          summary="each local step solves theta ≈ argmin f_i(theta) + (lambda/2)‖theta − w‖² "
          "by K inner steps, then w moves toward theta; server (1 − beta) w + beta mean w_i; "
          "evaluated with theta_i")
def pfedme(context: AlgorithmContext) -> FederatedAlgorithm:
    """pFedMe; the state is (w, W_0), a client's row its personalised model theta_i. A
    client's message is its local model w_i (through the run's transform); theta_i stays with
    it. The round is written here: it trains (w, theta) together and keeps theta as the row."""
    model = context.model
    refuse_stateful(model, "pfedme")

    def init(data, key, hp):
        del data, hp
        w0 = model.init(key)
        return w0, w0

    def fresh(state, clients):
        return stack(state[1], clients.shape[0])

    def round_(state, data, key, hp, exchange):
        # theta starts at the global model each round; rows are for evaluation
        clients = exchange.clients
        w = state[0]
        train_key = training_key(key)
        size = clients.shape[0]
        lam, personal_lr, lr = hp.params.lam, hp.params.personal_lr, hp.training.lr

        def objective(p, xb, yb, mask):
            local = jax.lax.stop_gradient(p["w"])

            def inner(_, theta):
                grads = jax.grad(lambda t: masked_cross_entropy(model.apply(t, xb), yb, mask)
                                 + 0.5 * lam * squared_distance(t, local))(theta)
                return jax.tree.map(lambda t, g: t - personal_lr * g, theta, grads)

            solved = jax.lax.stop_gradient(jax.lax.fori_loop(
                0, hp.params.inner_steps, inner, jax.lax.stop_gradient(p["theta"])))
            total = (0.5 * lam * squared_distance(p["w"], solved)
                     + squared_distance(p["theta"], solved) / (2.0 * lr))
            return total, masked_cross_entropy(model.apply(solved, xb), yb, mask)

        start = stack({"w": w, "theta": w})
        trained, stats, exchange = train_and_collect(
            Start(start, RoundClients(clients, jnp.zeros((size,), jnp.int32)),
                  training=hp.training.replace(objective=objective).per_client()),
            data, train_key, exchange=exchange, sent=part_at("w"), block_size=context.block_size)
        beta = hp.params.beta
        mean, exchange = plain_mean_of(trained["w"], exchange, w)
        new_w = jax.tree.map(lambda g, m: (1.0 - beta) * g + beta * m, w, mean)
        metrics = training_metrics(data.train_counts[clients], stats)  # theta's loss
        return (new_w, state[1]), metrics, exchange.replace(rows=trained["theta"])

    def models(state, rows, clients):
        del state, clients
        return rows

    return FederatedAlgorithm(init, sampled(context.clients_per_round), round_, from_rows(),
                              client_state=ClientState(fresh, models, context.store_dtype))
