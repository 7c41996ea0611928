"""The round primitives every algorithm shares: train a round's clients and either collect
their models ([S, ...]) or reduce them on the fly into weighted per-segment sums ([K, ...]).

Clients with a dense ReLU stack or a CNN's large layer and plain SGD train on the factored
paths (`mcfl.engine.lowrank`, `training.local_train_factored`) when those are cheaper; the
others train per client (`training.local_train`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from mcfl.data.federated import FederatedData
from mcfl.engine import lowrank
from mcfl.engine.blocks import (
    BlockSums,
    block_size_for,
    by_length,
    loop_scope,
    map_clients,
    reduce_clients,
)
from mcfl.engine.training import (
    ClientStats,
    LocalTraining,
    PyTree,
    ceil_div,
    client_num_steps,
    local_train,
    local_train_factored,
    squared_distance,
    steps_key,
)
from mcfl.models.spec import local_part, with_local_part


class RoundClients(NamedTuple):
    """The clients of a round and where each starts from (all [S] int32).

    `active` [S] bool, when given, marks the clients that really train: the others take no
    step, weigh nothing and come back as their start model (fixed shapes for a varying number
    of clients, e.g. FlexCFL's newcomers). Sorted by step count, inactive clients fill the last
    blocks, which cost (almost) nothing.
    """

    clients: jax.Array  # client ids
    start_index: jax.Array  # row of `start_models` each client starts from (and is pulled to)
    active: Optional[jax.Array] = None
    # [S, ...] per-client gradient corrections (`local_train`), trained on the per-client path
    correction: Optional[PyTree] = None
    # [S] row of `start_models` each client's proximal term pulls to, when it is not the row
    # it starts from (Ditto's personal models, pulled to the global one); per-client path
    anchor_index: Optional[jax.Array] = None
    # [S] int32 local steps of each client, when fewer than the training's own count (which
    # caps them: E epochs or `local_steps`): FlexCFL's newcomers continue their last E - 1
    # epochs after a pre-training epoch
    steps: Optional[jax.Array] = None


def _training_inputs(training, data, selection, weights, segments, prox_scale):
    """The round's per-client inputs ([S] each, in selection order)."""
    steps = client_num_steps(data.train_counts[selection.clients], training)
    if selection.steps is not None:  # never above the training's count (the factored
        steps = jnp.minimum(selection.steps, steps)  # paths' capacity follows from it)
    weights = weights.astype(jnp.float32)
    if selection.active is not None:
        steps = jnp.where(selection.active, steps, 0)
        weights = jnp.where(selection.active, weights, 0.0)
    inputs = {
        "client": selection.clients,
        "start": selection.start_index,
        "steps": steps,
        "weight": weights,
        "segment": segments,
        "prox_scale": jnp.broadcast_to(jnp.asarray(prox_scale, jnp.float32), steps.shape),
    }
    if selection.correction is not None:
        inputs["correction"] = selection.correction
    if selection.anchor_index is not None:
        inputs["anchor"] = selection.anchor_index
    return inputs


def _training_block_fn(training, data, key, start_models, assign=None, capacity=None,
                       align=None):
    """Per-client training of a block (vmapped; unbatched for a block of one); with a
    `capacity`, the model's large layer is kept factored (`local_train_factored`)."""
    def one_client(inp, loop_length, alone):
        start = jax.tree.map(lambda m: m[inp["start"]], start_models)
        if training.client_state is not None:  # FedBN: the client's own norm layers
            start = with_local_part(
                start, jax.tree.map(lambda m: m[inp["client"]], training.client_state))
        anchor = start
        if "anchor" in inp:
            anchor = jax.tree.map(lambda m: m[inp["anchor"]], start_models)
        if capacity is None:
            trained, loss_sum, taken = local_train(
                training, data, key, start, anchor, inp["client"], inp["steps"], loop_length,
                inp["prox_scale"], masked=not alone, correction=inp.get("correction"),
            )
        else:
            trained, loss_sum, taken = local_train_factored(
                training, data, key, start, inp["client"], inp["steps"], loop_length,
                inp["prox_scale"], capacity, masked=not alone,
            )
        stats = ClientStats(
            loss=loss_sum / jnp.maximum(taken, 1),
            steps=taken,
            update_norm=jnp.sqrt(squared_distance(trained, start)),
            sq_norm=sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(trained)),
        )
        if training.client_state is not None:
            stats = stats._replace(client=inp["client"],
                                   local=local_part(trained, training.collections))
        return trained, stats

    # blocks of one: the CNN's case, 23% faster
    train_block = by_length(one_client, "steps", steps_key(training))

    def block_fn(block):
        trained, stats = train_block(block)
        segment = block["segment"] if assign is None else assign(trained)
        if align is not None:
            trained = align(trained, segment)
        return trained, segment, stats

    return block_fn


def low_rank_capacity(training: LocalTraining, data: FederatedData,
                      start_models: PyTree) -> Optional[int]:
    """The most local steps a client can take this round if the round runs on the factored
    path (`mcfl.engine.lowrank`), or None to run per-client models. Decided at trace time from
    static shapes: ``training.low_rank`` "on" forces it (plain SGD on a dense ReLU stack only),
    "auto" takes it when `lowrank.worth_low_rank` says it is cheaper."""
    if training.low_rank == "off":
        return None
    layers = training.dense_layers
    if layers is None and training.factored is not None:
        layers = (training.factored.name,)
    if (not training.plain_sgd or layers is None or training.train_apply is not None
            or training.objective is not None):
        if training.low_rank == "on":
            raise ValueError("the low-rank path needs plain SGD on a dense ReLU stack or a "
                             "model with one large dense layer (the CNNs), without a train "
                             "mode (dropout, batch norm)")
        return None
    if training.local_steps is not None:
        capacity = training.local_steps
    else:
        capacity = training.local_epochs * ceil_div(data.max_train_count, training.batch_size)
    if training.low_rank == "auto":
        shapes = lowrank.layer_shapes(start_models, layers)
        if not lowrank.worth_low_rank(capacity * training.batch_size, shapes):
            return None
    return max(int(capacity), 1)


def _low_rank_block_fn(training, data, key, start_models, capacity, assign, sum_in_block,
                       align=None):
    """`_training_block_fn` on the factored path. With one start model, one segment and no
    `assign`, the block returns its weighted sum directly and never forms per-client models."""
    layers = training.dense_layers
    shared = jax.tree.leaves(start_models)[0].shape[0] == 1
    start = jax.tree.map(lambda m: m[0], start_models) if shared else start_models

    def block_fn(block):
        @loop_scope(steps_key(training))
        def train(loop_length):
            return lowrank.train_block(
                layers, training.lr, training.mu, training.batch_size, capacity, data, key,
                start, shared, block, loop_length,
            )

        loop_length = jnp.max(block["steps"])
        # A block of clients that take no step (inactive ones, sorted last) skips even the
        # up-front products: its factors are zeros.
        result = jax.lax.cond(
            loop_length > 0, train,
            lambda _: jax.tree.map(jnp.zeros_like, jax.eval_shape(train, loop_length)),
            loop_length,
        )
        update_norm, sq_norm = lowrank.update_and_model_norms(
            start, layers, shared, block["start"], result
        )
        stats = ClientStats(
            loss=result.loss_sum / jnp.maximum(result.taken, 1),
            steps=result.taken,
            update_norm=update_norm,
            sq_norm=sq_norm,
        )
        if sum_in_block and shared and assign is None and align is None:
            summed = lowrank.weighted_sum(start, layers, result, block["weight"])
            return BlockSums(jax.tree.map(lambda x: x[None], summed)), block["segment"], stats
        trained = lowrank.materialize(start, layers, shared, block["start"], result)
        segment = block["segment"] if assign is None else assign(trained)
        if align is not None:
            trained = align(trained, segment)
        return trained, segment, stats

    return block_fn


def _prepare_training(training, data, key, start_models, selection, weights, segments,
                      prox_scale, assign, sum_in_block=False, align=None):
    """The clients' inputs and the block function, shared by the collecting and the reducing
    entry points. Clients with gradient corrections or their own anchors train on the
    per-client path."""
    inputs = _training_inputs(training, data, selection, weights, segments, prox_scale)
    per_client = selection.correction is not None or selection.anchor_index is not None
    capacity = None if per_client else low_rank_capacity(training, data, start_models)
    if capacity is None or training.dense_layers is None:
        block_fn = _training_block_fn(training, data, key, start_models, assign, capacity, align)
    else:
        block_fn = _low_rank_block_fn(training, data, key, start_models, capacity, assign,
                                      sum_in_block, align)
    return inputs, block_fn


def train_and_collect(
    training: LocalTraining,
    data: FederatedData,
    key: jax.Array,
    start_models: PyTree,
    selection: RoundClients,
    prox_scale: jax.Array | float = 1.0,
    features: Optional[Callable[[PyTree], jax.Array]] = None,
    *,
    block_size: Optional[int] = None,
) -> tuple[PyTree, ClientStats]:
    """Train the selected clients, each from ``start_models[start_index]`` (also its proximal
    anchor), and return their trained models stacked [S, ...] in selection order; with
    `features` (a block of models [b, ...] -> [b, f]), each block's features instead, so that
    the models of all S clients are never held at once (FeSEM's and Robust's start: the
    clients' flattened models, [S, d]). Blocks of `block_size` clients (default: the plan's,
    `blocks.block_size_for`)."""
    size = selection.clients.shape[0]
    inputs, block_fn = _prepare_training(
        training, data, key, start_models, selection, jnp.zeros(size),
        jnp.zeros(size, jnp.int32), prox_scale, None,
    )
    if features is not None:
        train_block = block_fn

        def block_fn(block):
            trained, segment, stats = train_block(block)
            return features(trained), segment, stats

    block_size = block_size_for(start_models, size, block_size)
    models, _, stats = map_clients(block_fn, inputs, inputs["steps"], block_size)
    return models, stats


def train_and_aggregate(
    training: LocalTraining,
    data: FederatedData,
    key: jax.Array,
    start_models: PyTree,
    selection: RoundClients,
    weights: jax.Array,
    segments: jax.Array,
    num_segments: int,
    prox_scale: jax.Array | float = 1.0,
    assign: Optional[Callable[[PyTree], jax.Array]] = None,
    align: Optional[Callable[[PyTree, jax.Array], PyTree]] = None,
    *,
    block_size: Optional[int] = None,
) -> tuple[PyTree, jax.Array, jax.Array, ClientStats]:
    """Train the selected clients and return weighted per-segment sums of their models
    ([K, ...]), the per-segment weight sums [K], each client's segment [S] and per-client stats
    [S], in selection order. Client models are never all alive at once: only one block of them.

    A client's segment is ``segments[i]``, or, with `assign`, ``assign(trained_block)`` computed
    after training (FeSEM's E-step on the freshly trained models). With `align`, the block's
    models are replaced by ``align(trained_block, segment)`` before they are summed (FeSEM-MA's
    matched averaging). Blocks as in `train_and_collect`.
    """
    inputs, block_fn = _prepare_training(
        training, data, key, start_models, selection, weights, segments, prox_scale, assign,
        sum_in_block=num_segments == 1, align=align,
    )
    like = jax.tree.map(lambda m: m[0], start_models)
    block_size = block_size_for(start_models, selection.clients.shape[0], block_size)
    sums, weight_sums, (segment, stats) = reduce_clients(
        block_fn, inputs, inputs["steps"], block_size, num_segments, like
    )
    return sums, weight_sums, segment, stats
