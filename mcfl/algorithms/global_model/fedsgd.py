"""FedSGD (McMahan et al., 2017): one full-batch gradient per sampled client per round; the
server averages them (weighted by n_i) and takes one step of its optimizer.

Its round is not the skeleton's (`mcfl.algorithms.framework.skeleton`): a client computes a gradient
instead of training. The gradient is its message: it goes through the run's transform (stage
(d)) in `gradients_and_aggregate`, and the sums through the transform's server part."""

from __future__ import annotations

import dataclasses
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
import optax

from mcfl.algorithms.framework.base import (
    Exchange,
    FederatedAlgorithm,
    refuse_mutable_state,
    sampled,
    stack,
)
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import global_model
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
    reduce_clients,
    server_part,
)


def gradients_and_aggregate(
    apply_fn: ApplyFn,
    data: FederatedData,
    start_models: PyTree,
    selection: RoundClients,
    weights: jax.Array,
    segments: jax.Array,
    num_segments: int,
    chunk: int = CLIENT_ROWS_CHUNK,
    block_size: Optional[int] = None,
    exchange: Optional[Exchange] = None,
) -> tuple[PyTree, jax.Array, jax.Array, Optional[Exchange]]:
    """FedSGD's client work: each selected client's full-batch gradient at its start model
    (its message, through the exchange's transform), reduced into weighted per-segment sums.
    Returns (sums, weight_sums, loss [S], exchange)."""
    counts = data.train_counts[selection.clients]
    inputs = {
        "client": selection.clients,
        "start": selection.start_index,
        "chunks": ceil_div(counts, chunk),
        "weight": weights.astype(jnp.float32),
        "segment": segments,
    }

    gradient_block = by_length(gradient_of_client(apply_fn, data, start_models, chunk), "chunks")
    transform = None if exchange is None else exchange.transform

    def block_fn(block):
        grads, loss = gradient_block(block)
        if transform is not None and transform.client is not None:
            grads = jax.vmap(lambda g: transform.client(g, exchange.transform_state))(grads)
        return grads, block["segment"], loss

    like = jax.tree.map(lambda m: m[0], start_models)
    block_size = block_size_for(start_models, selection.clients.shape[0], block_size)
    sums, weight_sums, (_, loss) = reduce_clients(block_fn, inputs, inputs["chunks"], block_size,
                                                  num_segments, like)
    sums, weight_sums, exchange = server_part(exchange, sums, weight_sums, UPDATES)
    return sums, weight_sums, loss, exchange


class FedSGDState(flax.struct.PyTreeNode):
    params: object
    opt_state: object


@dataclasses.dataclass(frozen=True)
class FedSGDParams:
    """FedSGD has no hyperparameters of its own; its clients compute one full-batch gradient
    and train nothing, so the settings of local training go unused (`unused`)."""

    def unused(self, run) -> dict[str, str]:
        why = ("is a setting of local training; a FedSGD client computes its full-batch "
               "gradient and trains nothing (--lr is the server's step)")
        keys = ("client_optimizer", "weight_decay", "low_rank") + (
            () if run.clock else ("batch_size", "local_epochs", "local_steps"))
        return {key: why for key in keys}


@register("fedsgd", FedSGDParams, reference="McMahan et al., 2017",
          summary="each sampled client computes its full-batch gradient; the server averages "
          "them (weighted by n_i) and takes one SGD step of size --lr")
def fedsgd(context: AlgorithmContext, chunk: int = CLIENT_ROWS_CHUNK) -> FederatedAlgorithm:
    refuse_mutable_state(context.model, "fedsgd")
    """FedSGD with the server optimizer ``optax.sgd(lr)``, lr the run's one learning rate
    (``hp.training.lr``). Each client's gradient is accumulated over chunks of `chunk` rows, so
    any client size fits in memory."""
    model, clients_per_round = context.model, context.clients_per_round

    def server_optimizer(hp):
        return optax.sgd(hp.training.lr)

    def init(data, key, hp):
        del data
        params = model.init(key)
        return FedSGDState(params, server_optimizer(hp).init(params))

    def round_(state, data, key, hp, exchange):
        del key  # (it chose the participants)
        clients = exchange.clients
        zeros = jnp.zeros_like(clients)
        weights = exchange.weigh(data.train_counts[clients])
        sums, weight_sums, losses, exchange = gradients_and_aggregate(
            model.apply, data, stack(state.params), RoundClients(clients, zeros), weights,
            zeros, 1, chunk, context.block_size, exchange)
        grad = jax.tree.map(lambda s: s[0] / jnp.maximum(weight_sums[0], 1e-30), sums)
        updates, opt_state = server_optimizer(hp).update(grad, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        heard = weight_sums[0] > 0  # nobody reported (all dropped out): no step at all
        params, opt_state = jax.tree.map(lambda new, old: jnp.where(heard, new, old),
                                         (params, opt_state), (state.params, state.opt_state))
        w = weights.astype(jnp.float32)
        metrics = {
            "train_loss": jnp.sum(w * losses) / jnp.maximum(jnp.sum(w), 1e-30),
            # Clients send gradients and keep no model of their own: Eq. 3's w_i is w_t.
            "discrepancy": jnp.zeros(()),
            "local_steps": jnp.ones(()),
            "models_down": jnp.float32(clients_per_round),
            "models_up": jnp.float32(clients_per_round),  # gradients, the size of a model
            "server_step_norm": optax.tree.norm(updates),
        }
        return FedSGDState(params, opt_state), metrics, exchange

    # (the whole round key samples the clients)
    return FederatedAlgorithm(init, sampled(clients_per_round, lambda key: key), round_,
                              global_model())
