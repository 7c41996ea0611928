"""The round primitives every algorithm shares: train a round's clients and either collect
their models ([S, ...]) or reduce them on the fly into weighted per-segment sums ([K, ...]).

Clients with a dense ReLU stack or a CNN's large layer and plain SGD train on the factored
paths (`mcfl.engine.lowrank`, `training.local_train_factored`) when those are cheaper; the
others train per client (`training.local_train`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Optional

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
    ClientTask,
    LocalTraining,
    PyTree,
    ceil_div,
    client_num_steps,
    local_train,
    local_train_factored,
    squared_distance,
    steps_key,
)
from mcfl.errors import ConfigError
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


class Start(NamedTuple):
    """Stage (b): the models the round's clients start from (`models` [M, ...]; client i from
    ``models[selection.start_index[i]]``), how they train (`training`; an algorithm's round
    may leave it None for ``hp.training``, `mcfl.algorithms.framework.skeleton.aggregate`), and,
    when their messages are summed, how: into segment ``segments[i]`` of `num_segments` (or the
    one ``assign(messages)`` picks after training: FeSEM's E-step), times ``weights[i]``.
    `prox_scale` [S] scales a proximal term per client; `align` rewrites a block of messages
    before they are summed (FeSEM-MA); `reference` [K, ...]: the model each segment's
    messages are updates of, for a transform acting on update sums (`server_part`)."""

    models: PyTree
    selection: RoundClients
    weights: Optional[jax.Array] = None
    segments: Optional[jax.Array] = None
    num_segments: int = 1
    training: Optional[LocalTraining] = None
    prox_scale: Any = 1.0
    assign: Optional[Callable] = None
    align: Optional[Callable] = None
    reference: Optional[PyTree] = None


def _training_of(start: Start) -> LocalTraining:
    if start.training is None:
        raise ValueError("the engine trains a Start with its training given")
    return start.training


class Part(NamedTuple):
    """The part of a client's trained tree it sends (its message), and how to put a part back:
    the whole tree by default; FedPer's shared layers, APFL's global model, FedEM's components
    otherwise."""

    get: Callable[[PyTree], PyTree]
    put: Callable[[PyTree, PyTree], PyTree]


WHOLE = Part(lambda tree: tree, lambda tree, part: part)


def part_at(key: str) -> Part:
    """The entry `key` of a dict-shaped client tree."""
    return Part(lambda tree: tree[key], lambda tree, part: {**tree, key: part})


def _own_positions(exchange, clients: jax.Array):
    """Each client's position among the round's participants [S] and whether it is one."""
    same = clients[:, None] == exchange.clients[None, :]
    return jnp.argmax(same, axis=1).astype(jnp.int32), jnp.any(same, axis=1)


def _training_inputs(training, data, selection, weights, segments, prox_scale, exchange):
    """The round's per-client inputs ([S] each, in selection order)."""
    steps = client_num_steps(data.train_counts[selection.clients], training)
    if selection.steps is not None:  # never above the training's count (the factored
        steps = jnp.minimum(selection.steps, steps)  # paths' capacity follows from it)
    if exchange is not None and getattr(exchange, "step_limit", None) is not None:
        # the steps each participant finished on the simulated clock (`mcfl.system.clock`)
        position, is_participant = _own_positions(exchange, selection.clients)
        steps = jnp.where(is_participant,
                          jnp.minimum(steps, exchange.step_limit[position]), steps)
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
    if _has_norm_layers(exchange):
        inputs["own"], inputs["is_own"] = _own_positions(exchange, selection.clients)
    return inputs


def _has_norm_layers(exchange) -> bool:
    return exchange is not None and exchange.norm_layers is not None


def _start_of(start_models, exchange, inp, collections):
    """The model a client starts from: its row of `start_models`, with its own normalisation
    layers (FedBN) when it is one of the round's participants."""
    start = jax.tree.map(lambda m: m[inp["start"]], start_models)
    if "own" not in inp:
        return start
    own = jax.tree.map(lambda m: m[inp["own"]], exchange.norm_layers)
    kept = local_part(start, collections)
    return with_local_part(start, jax.tree.map(lambda o, k: jnp.where(inp["is_own"], o, k),
                                               own, kept))


def _training_block_fn(training, data, key, start_models, exchange, capacity=None):
    """Per-client training of a block (vmapped; unbatched for a block of one); with a
    `capacity`, the model's large layer is kept factored (`local_train_factored`). Returns the
    trained models [b, ...], their stats [b] and, with FedBN, their trained normalisation
    layers [b]."""
    def one_client(inp, loop_length, alone):
        start = _start_of(start_models, exchange, inp, training.collections)
        anchor = start
        if "anchor" in inp:
            anchor = jax.tree.map(lambda m: m[inp["anchor"]], start_models)
        step_losses = None
        task = ClientTask(inp["client"], inp["steps"], loop_length, inp["prox_scale"],
                          masked=not alone)
        if capacity is None:
            trained, loss_sum, taken, *recorded = local_train(
                training, data, key, start, anchor, task, correction=inp.get("correction"))
            step_losses = recorded[0] if recorded else None
        else:
            trained, loss_sum, taken = local_train_factored(training, data, key, start, task,
                                                            capacity)
        stats = ClientStats(
            loss=loss_sum / jnp.maximum(taken, 1),
            steps=taken,
            update_norm=jnp.sqrt(squared_distance(trained, start)),
            sq_norm=sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(trained)),
            step_losses=step_losses,
        )
        own = (local_part(trained, training.collections) if "own" in inp else None)
        return trained, (stats, own)

    # blocks of one: the CNN's case, 23% faster
    return by_length(one_client, "steps", steps_key(training))


def low_rank_capacity(training: LocalTraining, data: FederatedData,
                      start_models: PyTree) -> Optional[int]:
    """The most local steps a client can take this round if the round runs on the factored
    path (`mcfl.engine.lowrank`), or None to run per-client models. Decided at trace time from
    static shapes: ``training.fast.low_rank`` "on" forces it (plain SGD on a dense ReLU stack only),
    "auto" takes it when `lowrank.worth_low_rank` says it is cheaper."""
    fast = training.fast
    if fast.low_rank == "off":
        return None
    layers = fast.dense_layers
    if layers is None and fast.factored is not None:
        layers = (fast.factored.name,)
    if (not training.plain_sgd or layers is None or training.train_apply is not None
            or training.objective is not None or training.record_losses):
        if fast.low_rank == "on":
            raise ValueError("the low-rank path needs plain SGD on a dense ReLU stack or a "
                             "model with one large dense layer (the CNNs), without a train "
                             "mode (dropout, batch norm) or recorded step losses")
        return None
    if training.local_steps is not None:
        capacity = training.local_steps
    else:
        capacity = training.local_epochs * ceil_div(data.max_train_count, training.batch_size)
    if fast.low_rank == "auto":
        shapes = lowrank.layer_shapes(start_models, layers)
        if not lowrank.worth_low_rank(capacity * training.batch_size, shapes):
            return None
    return max(int(capacity), 1)


def _low_rank_block_fn(training, data, key, start_models, capacity, sum_in_block):
    """The block's training on the factored path: trained models [b, ...] and stats [b]; with
    `sum_in_block` (one start model, summed into one segment, nothing to do per client), the
    block's weighted sum directly (`BlockSums`), never forming per-client models."""
    layers = training.fast.dense_layers
    shared = jax.tree.leaves(start_models)[0].shape[0] == 1
    start = jax.tree.map(lambda m: m[0], start_models) if shared else start_models

    def block_fn(block):
        @loop_scope(steps_key(training))
        def train(loop_length):
            sgd = lowrank.LowRankSGD(layers, training.lr, training.mu, training.batch_size,
                                     capacity)
            return lowrank.train_block(sgd, data, key, start, shared, block, loop_length)

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
        if sum_in_block and shared:
            summed = lowrank.weighted_sum(start, layers, result, block["weight"])
            return BlockSums(jax.tree.map(lambda x: x[None], summed)), (stats, None)
        return lowrank.materialize(start, layers, shared, block["start"], result), (stats, None)

    return block_fn


def _message_fn(exchange, start_models, sent: Optional[Part], collections):
    """``(trained [b], block) -> trained [b]`` with each client's message (`sent`'s part of
    its update, trained minus start) through the exchange's transform (stage (d)), or None
    when there is nothing to transform (no exchange, nothing sent, or a transform without a
    client part)."""
    if exchange is None or sent is None or exchange.transform.client is None:
        return None
    transform, state = exchange.transform, exchange.transform_state

    def apply(trained, block):
        def one(t, inp):
            start = _start_of(start_models, exchange, inp, collections)
            base = sent.get(start)
            message = jax.tree.map(jnp.subtract, sent.get(t), base)
            message = transform.client(message, state)
            return sent.put(t, jax.tree.map(lambda b, m: (b + m).astype(b.dtype), base,
                                            message))

        return jax.vmap(one)(trained, block)

    return apply


def _prepare_training(start: Start, data, key, exchange, sent=WHOLE, sum_in_block=False):
    """The clients' inputs and the block function, shared by the collecting and the reducing
    entry points: train (stage (c)), the message transform (stage (d)), then the segment
    (`start.assign`, decided on the messages: FeSEM's E-step) and `start.align`. Clients with
    gradient corrections or their own anchors train on the per-client path."""
    training, start_models, selection = _training_of(start), start.models, start.selection
    assign, align = start.assign, start.align
    inputs = _training_inputs(training, data, selection, start.weights, start.segments,
                              start.prox_scale, exchange)
    per_client = selection.correction is not None or selection.anchor_index is not None
    capacity = None if per_client else low_rank_capacity(training, data, start_models)
    messages = _message_fn(exchange, start_models, sent, training.collections)
    if capacity is None or training.fast.dense_layers is None:
        train_block = _training_block_fn(training, data, key, start_models, exchange, capacity)
    else:
        summed = sum_in_block and messages is None and assign is None and align is None
        train_block = _low_rank_block_fn(training, data, key, start_models, capacity, summed)

    def block_fn(block):
        trained, (stats, own) = train_block(block)
        if isinstance(trained, BlockSums):
            return trained, block["segment"], (stats, own)
        if messages is not None:
            trained = messages(trained, block)
        segment = block["segment"] if assign is None else assign(trained)
        if align is not None:
            trained = align(trained, segment)
        return trained, segment, (stats, own)

    return inputs, block_fn


def _returned_norm_layers(exchange, inputs, own):
    """The exchange with the trained clients' own layers written back (FedBN)."""
    if own is None:
        return exchange
    position = jnp.where(inputs["is_own"], inputs["own"], exchange.clients.shape[0])
    layers = jax.tree.map(lambda rows, new: rows.at[position].set(new, mode="drop"),
                          exchange.norm_layers, own)
    return exchange.replace(norm_layers=layers, norm_trained=True)


def train_and_collect(
    start: Start,
    data: FederatedData,
    key: jax.Array,
    features: Optional[Callable[[PyTree], jax.Array]] = None,
    *,
    exchange=None,
    sent: Optional[Part] = WHOLE,
    block_size: Optional[int] = None,
) -> tuple[PyTree, ClientStats, object]:
    """Train the clients of `start` by its training, each from ``start.models[start_index]``
    (also its proximal anchor, scaled by ``start.prox_scale``; its weights and segments are
    not used), and return their trained models stacked [S, ...] in selection order, their stats
    and the exchange; with `features` (a block of models [b, ...] -> [b, f]), each block's
    features instead, so that the models of all S clients are never held at once (FeSEM's and
    Robust's start: the clients' flattened models, [S, d]). Blocks of `block_size` clients
    (default: `blocks.block_size_for`).

    With an `exchange` (`mcfl.algorithms.framework.base.Exchange`), the clients that are the round's
    participants start from their own normalisation layers (FedBN) and the trained ones are
    returned in it, and each client's message, the `sent` part of its update, goes through
    the exchange's transform: the returned models carry the transformed part (start +
    transformed update). ``sent=None``: the clients keep what they trained and send none of it
    (Local, Ditto's personal models): their own normalisation layers, no transform. Without an
    exchange (outside a round), neither."""
    size = start.selection.clients.shape[0]
    start = start._replace(weights=jnp.zeros(size), segments=jnp.zeros(size, jnp.int32),
                           assign=None, align=None)
    inputs, block_fn = _prepare_training(start, data, key, exchange, sent)
    if features is not None:
        train_block = block_fn

        def block_fn(block):
            trained, segment, aux = train_block(block)
            return features(trained), segment, aux

    block_size = block_size_for(start.models, size, block_size)
    models, _, (stats, own) = map_clients(block_fn, inputs, inputs["steps"], block_size)
    return models, _reported(stats, exchange, inputs["client"]), \
        _returned_norm_layers(exchange, inputs, own)


def train_and_aggregate(
    start: Start,
    data: FederatedData,
    key: jax.Array,
    *,
    exchange=None,
    block_size: Optional[int] = None,
) -> tuple[PyTree, jax.Array, jax.Array, ClientStats, object]:
    """Train the clients of `start` by its training (stage (c)), pass each one's message
    through the exchange's transform (stage (d)) and return weighted per-segment sums of
    their models ([K, ...], stage (e), with the transform's server part applied), the
    per-segment weight sums [K], each client's segment [S], per-client stats [S] (in
    selection order) and the exchange.
    Client models are never all alive at once: only one block of them.

    A client's segment is ``start.segments[i]``, or, with `start.assign`,
    ``assign(message_block)`` computed after training (FeSEM's E-step on the freshly trained
    models). With `start.align`, the block's models are replaced by ``align(trained_block,
    segment)`` before they are summed (FeSEM-MA's matched averaging). Blocks and the exchange
    as in `train_and_collect`; `start.reference` [K, ...]: the model each segment's clients
    started from, for a transform that acts on update sums (`server_part`).
    """
    inputs, block_fn = _prepare_training(start, data, key, exchange,
                                         sum_in_block=start.num_segments == 1)
    like = jax.tree.map(lambda m: m[0], start.models)
    block_size = block_size_for(start.models, start.selection.clients.shape[0], block_size)
    sums, weight_sums, (segment, (stats, own)) = reduce_clients(
        block_fn, inputs, inputs["steps"], block_size, start.num_segments, like
    )
    exchange = _returned_norm_layers(exchange, inputs, own)
    sums, weight_sums, exchange = server_part(exchange, sums, weight_sums, start.reference)
    stats = _reported(stats, exchange, inputs["client"])
    return sums, weight_sums, segment, stats, exchange


def _reported(stats: ClientStats, exchange, clients: jax.Array) -> ClientStats:
    """The stats with which clients report (`Exchange.present`: a Poisson round's empty
    slots, the clients that dropped out), so that a round's metrics are over those
    (`mcfl.algorithms.framework.base.training_metrics`). `clients` [n] are the ones trained: the
    round's participants, or others an algorithm asks itself (FL+HC's clustering round asks
    everyone), who report."""
    if exchange is None or exchange.present is None:
        return stats
    position, is_participant = _own_positions(exchange, clients)
    return stats._replace(reported=jnp.where(is_participant, exchange.present[position], 1.0))


def server_part(exchange, sums: PyTree, weight_sums: jax.Array, reference=None):
    """Stage (e)'s end: the aggregated messages (weighted per-segment sums [K, ...] and their
    weights [K]) through the exchange's transform's server part, which may update its state;
    as they are when it has none.

    A transform that acts on update sums (``transform.on_updates``: DP's noise) gets
    ``sums - weight_sums * reference``, the sums of the clients' updates from `reference`
    [K, ...] (the model each segment's clients started from), and its result is turned back
    into sums of models with its own weights: the segment's mean is then ``reference +
    (noised update sum) / (its weight)``. `reference` is `UPDATES` when the sums are of
    updates already (SCAFFOLD's); a round that gives none cannot run such a transform."""
    if exchange is None or exchange.transform.server is None:
        return sums, weight_sums, exchange
    key, own = jax.random.split(exchange.key)
    transform = exchange.transform
    if transform.on_updates and reference is None:
        raise ConfigError(f"the message transform {transform.name} acts on update sums, and "
                          f"this round does not say which model its sums are updates of")
    if transform.on_updates and reference is not UPDATES:
        sums = jax.tree.map(lambda s, r: s - _by_segment(weight_sums, s) * r, sums, reference)
    new_sums, new_weights, state = transform.server(sums, weight_sums,
                                                    exchange.transform_state, own)
    if transform.on_updates and reference is not UPDATES:
        new_sums = jax.tree.map(lambda s, r: s + _by_segment(new_weights, s) * r, new_sums,
                                reference)
    return new_sums, new_weights, exchange.replace(transform_state=state, key=key)


# `server_part`'s reference of sums that are sums of updates already.
UPDATES = "updates"


def _by_segment(weights: jax.Array, like: jax.Array) -> jax.Array:
    """[K] weights shaped to broadcast against a [K, ...] leaf."""
    return weights.reshape((-1,) + (1,) * (like.ndim - 1)).astype(like.dtype)
