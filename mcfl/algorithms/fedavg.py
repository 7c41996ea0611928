"""FedAvg (McMahan et al., 2017) and FedProx (Li et al., 2020) on the shared engine."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.algorithms.base import FederatedAlgorithm, stack, training_metrics
from mcfl.engine import LocalTraining, RoundClients, segment_mean, train_and_aggregate
from mcfl.models import ModelSpec
from mcfl.sampling import sample_clients


class GlobalModelState(flax.struct.PyTreeNode):
    params: object  # one model (unstacked)


def fedavg(
    model: ModelSpec,
    training: LocalTraining,
    clients_per_round: int,
    block_size: int,
    server_lr: float = 1.0,
    name: str = "fedavg",
) -> FederatedAlgorithm:
    """FedAvg: sampled clients train from the global model; the server moves the global model
    by `server_lr` toward the average of their models weighted by n_i (1.0: plain averaging).
    With ``training.mu > 0`` every local step adds FedProx's proximal term."""

    def init(data, key):
        del data
        return GlobalModelState(model.init(key))

    def round_(state, data, key):
        sample_key, train_key = jax.random.split(key)
        clients = sample_clients(sample_key, data.num_clients, clients_per_round)
        zeros = jnp.zeros_like(clients)
        weights = data.train_counts[clients]
        start = stack(state.params)
        sums, weight_sums, _, stats = train_and_aggregate(
            training,
            data,
            train_key,
            start,
            RoundClients(clients, zeros),
            weights,
            zeros,
            1,
            block_size,
        )
        average = jax.tree.map(lambda m: m[0], segment_mean(sums, weight_sums, start))
        params = jax.tree.map(lambda p, a: p + server_lr * (a - p), state.params, average)
        return GlobalModelState(params), training_metrics(weights, stats)

    def client_models(state):
        return stack(state.params), None

    return FederatedAlgorithm(name, init, round_, client_models)


def fedprox(
    model: ModelSpec,
    training: LocalTraining,
    clients_per_round: int,
    block_size: int,
    mu: float = 0.01,
    server_lr: float = 1.0,
) -> FederatedAlgorithm:
    """FedProx: FedAvg whose clients minimise ``F_i(W) + (mu/2)||W - W_t||^2`` (Eq. 2)."""
    return fedavg(
        model, training._replace(mu=mu), clients_per_round, block_size, server_lr, name="fedprox"
    )
