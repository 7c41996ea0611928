"""FedAvg (McMahan et al., 2017) and FedProx (Li et al., 2020) on the shared engine."""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.algorithms.framework.base import FederatedAlgorithm, stack
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import global_model, global_start, skeleton_algorithm
from mcfl.settings import setting


class GlobalModelState(flax.struct.PyTreeNode):
    params: object  # one model (unstacked)


@dataclasses.dataclass(frozen=True)
class FedAvgParams:
    server_lr: float = setting(1.0, "server step toward the clients' average (1: plain "
                               "averaging)", above=0)


@dataclasses.dataclass(frozen=True)
class FedProxParams(FedAvgParams):
    mu: float = setting(0.01, "proximal weight mu of (mu/2)||W - W_t||^2 (FedProx Eq. 2; 0.01 "
                        "as in the authors' code)", minimum=0)


def averaging(context: AlgorithmContext, server_lr, proximal: bool = False,
              size_weighted: bool = True) -> FederatedAlgorithm:
    """Sampled clients train from the global model (with FedProx's proximal term when
    `proximal`: weight ``hp.params.mu``); the server moves it by ``server_lr(hp.params)``
    toward their average, weighted by n_i (`size_weighted`) or plain. FedAvg, FedProx and the
    Reptile-style FedDist / FedDWS are this with different settings; the round is the
    skeleton's (`mcfl.algorithms.framework.skeleton`)."""

    def init(data, key, hp):
        del data, hp
        return GlobalModelState(context.model.init(key))

    def start(state, data, clients, hp):
        samples = data.train_counts[clients]
        weights = samples if size_weighted else jnp.ones_like(samples)
        training = hp.training.replace(mu=hp.params.mu) if proximal else hp.training
        return global_start(state.params, clients, weights, training)

    def server(state, summed, data, hp):
        average = jax.tree.map(lambda m: m[0], summed.mean(stack(state.params)))
        step = server_lr(hp.params)
        params = jax.tree.map(lambda p, a: p + step * (a - p), state.params, average)
        return GlobalModelState(params), summed.metrics(data)

    return skeleton_algorithm(context, init, start, server, global_model())


@register("fedavg", FedAvgParams, reference="McMahan et al., 2017",
          summary="sampled clients train from the global model; the server averages their "
          "models weighted by n_i")
def fedavg(context: AlgorithmContext) -> FederatedAlgorithm:
    """FedAvg (McMahan et al., 2017, Algorithm 1), with a server step ``hp.params.server_lr``
    toward the clients' average (1: the plain average)."""
    return averaging(context, lambda p: p.server_lr)


@register("fedprox", FedProxParams, reference="Li et al., 2020, FedProx",
          summary="FedAvg whose clients minimise F_i(W) + (mu/2)‖W − W_t‖² (Eq. 2)")
def fedprox(context: AlgorithmContext) -> FederatedAlgorithm:
    """FedProx (Li et al., 2020): FedAvg with the proximal term of Eq. 2 in every local
    step."""
    return averaging(context, lambda p: p.server_lr, proximal=True)
