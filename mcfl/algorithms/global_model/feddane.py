"""FedDANE (Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, 2019, "FedDANE: A Federated
Newton-Type Method", Algorithm 1).

Two exchanges a round with the sampled clients S_t: first each sends its full gradient
``grad F_k(W_t)`` at the global model; the server averages them into ``g_t`` (weighted by n_k)
and sends it back. Then each client approximately minimises

    F_k(W) + <g_t - grad F_k(W_t), W> + (mu / 2) ||W - W_t||^2

with its local SGD (the gradient-corrected, proximal local problem), and the server averages
the results weighted by n_k. The paper samples the two exchanges' clients independently; here,
as in the project's reference recipe, the same clients take part in both. Communication
counts both exchanges: 2 S models down and 2 S up.

Its round is not one pass of the skeleton (`mcfl.algorithms.framework.skeleton`): the gradients are
a first message (through the run's transform and its server part), then the skeleton's stages
train and aggregate the corrected local problems.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from mcfl.algorithms.framework.base import (
    FederatedAlgorithm,
    refuse_mutable_state,
    sampled,
    training_key,
    training_metrics,
)
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import aggregate, global_model, global_start, transformed
from mcfl.algorithms.global_model.fedavg import GlobalModelState
from mcfl.data.federated import FederatedData
from mcfl.engine import (
    CLIENT_ROWS_CHUNK,
    UPDATES,
    ApplyFn,
    PyTree,
    RoundClients,
    block_size_for,
    by_length,
    ceil_div,
    gradient_of_client,
    map_clients,
    segment_sums,
    server_part,
)
from mcfl.settings import setting


def client_gradients(
    apply_fn: ApplyFn,
    data: FederatedData,
    start_models: PyTree,
    selection: RoundClients,
    chunk: int = CLIENT_ROWS_CHUNK,
    block_size: Optional[int] = None,
) -> tuple[PyTree, jax.Array]:
    """Each selected client's full-batch gradient of its mean training loss at its start model,
    stacked [S, ...] in selection order, and its loss [S] (FedDANE's first exchange)."""
    counts = data.train_counts[selection.clients]
    inputs = {"client": selection.clients, "start": selection.start_index,
              "chunks": ceil_div(counts, chunk)}
    block_fn = by_length(gradient_of_client(apply_fn, data, start_models, chunk), "chunks")
    block_size = block_size_for(start_models, selection.clients.shape[0], block_size)
    return map_clients(block_fn, inputs, inputs["chunks"], block_size)


@dataclasses.dataclass(frozen=True)
class FedDANEParams:
    mu: float = setting(0.01, "proximal weight mu of the local problem (as FedProx's default)",
                        minimum=0)


@register("feddane", FedDANEParams, reference="Li et al., 2019, FedDANE",
          summary="clients send full gradients; each then minimises F_k(W) + <g - grad F_k(W_t), "
          "W> + (mu/2)‖W − W_t‖² by local SGD; the server averages (two exchanges a round)")
def feddane(context: AlgorithmContext) -> FederatedAlgorithm:
    refuse_mutable_state(context.model, "feddane")
    model = context.model

    def init(data, key, hp):
        del data, hp
        return GlobalModelState(model.init(key))

    def round_(state, data, key, hp, exchange):
        train_key = training_key(key)
        clients = exchange.clients
        zeros = jnp.zeros_like(clients)
        weights = exchange.weigh(data.train_counts[clients])
        begun = global_start(state.params, clients, weights,
                             hp.training.replace(mu=hp.params.mu))
        grads, _ = client_gradients(model.apply, data, begun.models, begun.selection,
                                    block_size=context.block_size)
        sums, totals = segment_sums(transformed(exchange, grads), zeros, weights, 1)
        sums, totals, exchange = server_part(exchange, sums, totals, UPDATES)
        mean_grad = jax.tree.map(lambda s: s[0] / jnp.maximum(totals[0], 1e-30), sums)
        correction = jax.tree.map(lambda g, m: m[None] - g, grads, mean_grad)  # [S, ...]
        # The correction is per client, so the factored paths (one shared product per
        # block) do not apply: the engine trains corrected clients on the per-client path.
        begun = begun._replace(selection=begun.selection._replace(correction=correction))
        summed, exchange = aggregate(context, begun, data, train_key, hp, exchange)
        params_ = jax.tree.map(lambda m: m[0], summed.mean(begun.models))
        metrics = training_metrics(weights, summed.stats)
        metrics["models_down"] = metrics["models_down"] * 2  # W_t, then g_t
        metrics["models_up"] = metrics["models_up"] * 2  # gradients, then models
        return GlobalModelState(params_), metrics, exchange

    return FederatedAlgorithm(init, sampled(context.clients_per_round), round_, global_model())
