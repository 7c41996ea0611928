"""FedNova (Wang, Liu, Liang, Joshi and Poor, NeurIPS 2020, "Tackling the Objective
Inconsistency Problem in Heterogeneous Federated Optimization"): normalised averaging.

Clients with more data take more local steps (E epochs of ceil(n_i / B) steps); FedAvg's
average of their models then drifts toward the objective of the clients that took the most
steps (the paper's objective inconsistency, Theorem 1). FedNova averages each client's update
divided by its own step count instead, and takes one step of the effective length (Eq. 6-7):

    d_i = (x - y_i) / ||a_i||_1,   x <- x - tau_eff sum_i p_i d_i,   tau_eff = sum_i p_i ||a_i||_1,

with p_i = n_i / sum_j n_j over the round's clients, y_i client i's trained model and a_i the
coefficients of its local gradients in its update (Sec. 4): for tau_i steps of plain SGD
||a_i||_1 = tau_i; with heavy-ball momentum rho,
(tau_i - rho (1 - rho^tau_i) / (1 - rho)) / (1 - rho); with FedProx's proximal term (weight
mu, learning rate eta), (1 - (1 - eta mu)^tau_i) / (eta mu). With equal step counts FedNova is
FedAvg.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from mcfl.algorithms.framework.base import FederatedAlgorithm, sampled, training_key
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import aggregate, global_model, global_start
from mcfl.algorithms.global_model.fedavg import GlobalModelState
from mcfl.engine import LocalTraining, client_num_steps
from mcfl.errors import ConfigError
from mcfl.settings import setting


@dataclasses.dataclass(frozen=True)
class FedNovaParams:
    mu: float = setting(0.0, "proximal weight mu of the clients' FedProx term (0: plain local "
                        "SGD, the paper's FedNova; > 0: FedProx normalised, Sec. 4)",
                        key="fednova_mu", minimum=0)

    def check(self, run) -> None:
        training = run.training
        if training.optimizer == "adam" or training.weight_decay != 0:
            raise ConfigError(
                f"fednova normalises by the local SGD steps' coefficients, known for sgd and "
                f"momentum without weight decay; got client_optimizer="
                f"{training.optimizer}, weight_decay={training.weight_decay}")
        if training.optimizer == "momentum" and self.mu > 0:
            raise ConfigError(f"fednova takes either momentum or fednova_mu > 0, not both "
                              f"(got momentum={training.momentum}, fednova_mu={self.mu})")


def gradient_weight(steps: jax.Array, training: LocalTraining) -> jax.Array:
    """||a_i||_1 [S]: the summed coefficients of a client's `steps` local gradients in its
    update, for the client optimizer of `training` (FedNova Sec. 4)."""
    steps = steps.astype(jnp.float32)
    if training.optimizer == "momentum":
        rho = jnp.asarray(training.momentum, jnp.float32)
        return (steps - rho * (1.0 - rho ** steps) / (1.0 - rho)) / (1.0 - rho)
    if training.mu is not None:
        shrink = jnp.asarray(training.lr * training.mu, jnp.float32)
        # 1 - (1 - shrink)^steps, without float32's cancellation for a tiny shrink
        stable = -jnp.expm1(steps * jnp.log1p(-jnp.minimum(shrink, 0.5)))
        direct = 1.0 - (1.0 - shrink) ** steps
        summed = jnp.where(shrink < 0.5, stable, direct) / jnp.maximum(shrink, 1e-30)
        return jnp.where(shrink > 0, summed, steps)
    return steps


@register("fednova", FedNovaParams, reference="Wang et al., 2020, FedNova",
          summary="clients train from the global model; each update is divided by its own "
          "number of local steps (||a_i||_1), and the server steps by their n_i-weighted mean "
          "times tau_eff = sum p_i ||a_i||_1 (Eq. 6-7)")
def fednova(context: AlgorithmContext) -> FederatedAlgorithm:
    """FedNova's round: one weighted sum of the trained models gives the normalised step,
    since sum_i p_i (x - y_i) / a_i = (sum_i w_i) x - sum_i w_i y_i with w_i = p_i / a_i."""

    def init(data, key, hp):
        del data, hp
        return GlobalModelState(context.model.init(key))

    def normalised(data, clients, hp, exchange):
        """The clients' training (mu 0 pulls with weight 0: the same steps, and mu stays a
        traced number a sweep can vary), their shares p_i among the clients that report and
        their ||a_i||_1 from the steps each takes (fewer when a deadline cuts its work:
        `Exchange.step_limit`, `mcfl.system`)."""
        training = hp.training.replace(mu=hp.params.mu)
        samples = data.train_counts[clients].astype(jnp.float32) * exchange.reporting()
        p = samples / jnp.maximum(jnp.sum(samples), 1.0)
        steps = client_num_steps(data.train_counts[clients], training)
        if exchange.step_limit is not None:
            steps = jnp.minimum(steps, exchange.step_limit)
        return training, p, gradient_weight(steps, training)

    def start(state, data, clients, hp, exchange):
        training, p, a = normalised(data, clients, hp, exchange)
        # A client without steps (none of its rows trained) moves nothing: weight 0.
        w = jnp.where(a > 0, p / jnp.maximum(a, 1e-30), 0.0)
        return global_start(state.params, clients, w, training)

    def server(state, summed, data, hp, exchange):
        _, p, a = normalised(data, summed.clients, hp, exchange)
        tau_eff = jnp.sum(p * a)
        params = jax.tree.map(lambda x, s: x - tau_eff * (summed.weight_sums[0] * x - s[0]),
                              state.params, summed.sums)
        metrics = summed.metrics(data)
        metrics["tau_eff"] = tau_eff
        return GlobalModelState(params), metrics

    def round_(state, data, key, hp, exchange):
        """The skeleton's round (`skeleton.round_of`), with the exchange given to the start
        and server stages: the steps each client takes set its normalisation."""
        begun = start(state, data, exchange.clients, hp, exchange)
        summed, exchange = aggregate(context, begun, data, training_key(key), hp,
                                     exchange)
        state, metrics = server(state, summed, data, hp, exchange)
        return state, metrics, exchange

    return FederatedAlgorithm(init, sampled(context.clients_per_round), round_,
                              global_model())
