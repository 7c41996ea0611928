"""The client engine: local training of many clients as one jitted computation.

Layout of the work (see README, "How the engine works"):

* Clients of a round are sorted by their number of local steps and cut into blocks of
  `block_size`. Blocks run one after another (`lax.scan`); inside a block the clients run
  together (`vmap`) through a loop over local steps whose length is the block's longest client.
  A client with fewer steps is masked: its extra steps leave parameters and optimizer state
  untouched. Memory stays at one block of client models (plus the outputs asked for).
* Each epoch of client ``i`` visits its samples in the order of a permutation keyed by
  ``fold_in(fold_in(round_key, i), epoch)``, evaluated only at the positions a step reads
  (`mcfl.batch_rule`): a round touches its own clients' rows and nothing else, and a client's
  batches do not depend on the other clients, on the blocking or on the sampling.
* A client's epoch is ``ceil(n_i / B)`` steps; the last batch of an epoch is partial and
  its missing rows are masked out of the loss.
* Results are either collected per client ([S, ...] stacked models) or reduced on the fly into
  weighted per-segment sums ([K, ...]), as FedAvg and the cluster M-steps need.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from mcfl import lowrank
from mcfl.batch_rule import step_rows
from mcfl.data.federated import FederatedData
from mcfl.lowrank import maybe_nonzero

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]

DEFAULT_EVAL_BATCH = 256
# Rows per step of the loops over ONE client's rows (IFCA's losses, FedSGD / FedDANE gradients,
# evaluating clients with models of their own). A client's last chunk is padded to full size,
# so the chunk should be small against a typical client: FlexCFL's FashionMNIST clients hold a
# median of 83 training rows, and IFCA's 5-model losses of 20 of them took 10.1 s a round in
# chunks of 256, 4.3 s in chunks of 64 and 4.5 s in chunks of 16 (2-core AMD EPYC); MCLR on
# Synthetic: 8 ms either way.
CLIENT_ROWS_CHUNK = 64


class LocalTraining(NamedTuple):
    """What a client does in a round: `optimizer` on the cross-entropy of `apply_fn`, plus
    ``(mu / 2) * ||W - anchor||^2`` (FedProx, Li et al. 2020, Eq. 2) when ``mu > 0``.

    The client runs `local_epochs` epochs of batches of `batch_size`, or exactly `local_steps`
    steps when that is set (cycling through epochs of its data).
    """

    apply_fn: ApplyFn
    optimizer: optax.GradientTransformation
    batch_size: int
    local_epochs: int = 1
    local_steps: Optional[int] = None
    mu: float = 0.0
    # The factored fast paths need the learning rate when `optimizer` is plain
    # ``optax.sgd(lr)``, and either the model's dense layers when it is a ReLU dense stack
    # (`mcfl.lowrank`) or its one large layer (`factored`).
    sgd_lr: Optional[float] = None
    dense_layers: Optional[tuple[str, ...]] = None
    low_rank: str = "auto"  # auto (when it is faster), on, off
    # For a model with one large dense layer after a trunk (the CNNs, `models.FactoredLayer`):
    # with plain SGD its kernel change can be kept factored (`local_train_factored`).
    factored: Optional[Any] = None


class ClientStats(NamedTuple):
    """Per-client by-products of local training, each [S]."""

    loss: jax.Array  # mean training loss over the client's steps (without the proximal term)
    steps: jax.Array  # local steps actually taken
    update_norm: jax.Array  # ||W_i(after) - W_i(start)||, FlexCFL Eq. 3's summand
    sq_norm: jax.Array  # ||W_i(after)||^2, for intra-cluster distances of streamed M-steps


def ceil_div(a, b):
    return (a + b - 1) // b


def client_num_steps(counts: jax.Array, training: LocalTraining) -> jax.Array:
    """Local steps of each client in a round: ``E * ceil(n_i / B)``, or the fixed step count."""
    if training.local_steps is not None:
        return jnp.full_like(counts, training.local_steps)
    return training.local_epochs * ceil_div(counts, training.batch_size)


def chunk_rows(i, chunk: int, offset, count) -> tuple[jax.Array, jax.Array]:
    """Positions [chunk] (in the owner-sorted row order) of the i-th chunk of a client's
    ``count`` rows starting at ``offset``, and the mask of the real ones (past the end, the last
    position is repeated and masked out)."""
    pos = i * chunk + jnp.arange(chunk, dtype=jnp.int32)
    return offset + jnp.minimum(pos, jnp.maximum(count - 1, 0)), pos < count


def masked_cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean cross-entropy over the rows where `mask` is true (0 if there are none)."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1)


def squared_distance(a: PyTree, b: PyTree) -> jax.Array:
    """||a - b||^2 summed over all leaves of two parameter trees."""
    return sum(jnp.sum(jnp.square(x - y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _select(pred, new: PyTree, old: PyTree) -> PyTree:
    return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


def local_train(
    training: LocalTraining,
    data: FederatedData,
    key: jax.Array,
    params: PyTree,
    anchor: PyTree,
    client: jax.Array,
    num_steps: jax.Array,
    loop_length: jax.Array,
    prox_scale: jax.Array | float = 1.0,
    masked: bool = True,
    correction: Optional[PyTree] = None,
) -> tuple[PyTree, jax.Array, jax.Array]:
    """One client's local training (unbatched; the engine vmaps it over a block).

    Runs `loop_length` iterations (the block's longest client) of which the first `num_steps`
    are real; with ``masked=False`` the caller promises they are the same (a block of one
    client), and the steps skip the masking. Step s reads `batch_rule.step_rows` of the round
    `key`. The proximal weight is ``training.mu * prox_scale`` (FeSEM weighs it per client,
    Eq. 8). A `correction` tree c adds the linear term ``<c, W>`` to the objective, so every
    step's gradient gains c (FedDANE's gradient correction).
    Returns the trained parameters, the summed training loss of the real steps, and the number
    of steps that changed the parameters (counted, not assumed).
    """
    batch = training.batch_size

    def objective(p, xb, yb, mask):
        loss = masked_cross_entropy(training.apply_fn(p, xb), yb, mask)
        total = loss
        if maybe_nonzero(training.mu):
            total = total + 0.5 * training.mu * prox_scale * squared_distance(p, anchor)
        return total, loss

    def step(s, carry):
        p, opt_state, loss_sum, taken = carry
        rows, mask = step_rows(key, data, client, s, batch)
        (_, loss), grads = jax.value_and_grad(objective, has_aux=True)(
            p, data.x_train[rows], data.y_train[rows], mask
        )
        if correction is not None:
            grads = jax.tree.map(jnp.add, grads, correction)
        updates, new_opt_state = training.optimizer.update(grads, opt_state, p)
        if not masked:
            return optax.apply_updates(p, updates), new_opt_state, loss_sum + loss, taken + 1
        active = s < num_steps
        p = _select(active, optax.apply_updates(p, updates), p)
        opt_state = _select(active, new_opt_state, opt_state)
        return p, opt_state, loss_sum + jnp.where(active, loss, 0.0), taken + active

    zero = jnp.zeros((), jnp.int32)
    init = (params, training.optimizer.init(params), jnp.zeros((), jnp.float32), zero)
    params, _, loss_sum, taken = jax.lax.fori_loop(0, loop_length, step, init)
    return params, loss_sum, taken


def local_train_factored(
    training: LocalTraining,
    data: FederatedData,
    key: jax.Array,
    params: PyTree,
    client: jax.Array,
    num_steps: jax.Array,
    loop_length: jax.Array,
    prox_scale: jax.Array | float,
    capacity: int,
    masked: bool = True,
) -> tuple[PyTree, jax.Array, jax.Array]:
    """`local_train` with plain SGD for a model ``head(trunk(x) @ K + b)`` around one large
    dense kernel K (``training.factored``), whose change is kept as factors.

    Why: a step's gradient of K is ``h^T delta`` (rank B); written out, it and the update of K
    move two [in, out] arrays per step (for the FashionMNIST CNN's 3136 x 1024 kernel, a
    third of a client step's time on CPU). After t steps ``K_t = K_0 + H^T G`` with H the
    stacked inputs h of the past steps and G their ``-lr * decay * delta``, so the forward is
    ``h K_0 + (h H^T) G`` and autodiff's backward ``delta K_0^T + (delta G^T) H`` touches only
    [B, t B] products. K's gradient is never formed: delta is the gradient of the loss with
    respect to a zero offset added to the layer's pre-activations. The proximal pull to the
    start (FedProx, FeSEM) decays G by ``1 - lr mu'`` each step, exactly as it decays K - K_0.
    `capacity` (static) bounds the steps; K is formed once, at the end. Equal to `local_train`
    to float rounding (tests/test_engine.py).
    """
    layer, lr, batch = training.factored, training.sgd_lr, training.batch_size
    kernel0 = params[layer.name]["kernel"]
    rest = {**params, layer.name: {k: v for k, v in params[layer.name].items() if k != "kernel"}}
    rows_cap = capacity * batch

    def objective(rest, offset, xb, yb, mask, hist_in, hist_grad):
        h = layer.trunk(rest, xb)  # [B, in]
        z = h @ kernel0 + (h @ hist_in.T) @ hist_grad + rest[layer.name]["bias"] + offset
        loss = masked_cross_entropy(layer.head(rest, z), yb, mask)
        total = loss
        if maybe_nonzero(training.mu):
            total = total + 0.5 * training.mu * prox_scale * squared_distance(rest, anchor)
        return total, (loss, h)

    anchor = rest

    def step(s, carry):
        rest, hist_in, hist_grad, loss_sum, taken = carry
        rows, mask = step_rows(key, data, client, s, batch)
        offset = jnp.zeros((batch, kernel0.shape[1]), jnp.float32)
        (_, (loss, h)), (grads, delta) = jax.value_and_grad(objective, argnums=(0, 1),
                                                            has_aux=True)(
            rest, offset, data.x_train[rows], data.y_train[rows], mask, hist_in, hist_grad)
        active = jnp.asarray(True) if not masked else s < num_steps
        scale = jnp.where(active, -lr, 0.0)
        rest = jax.tree.map(lambda p, g: p + scale * g, rest, grads)
        if maybe_nonzero(training.mu):
            hist_grad = hist_grad * jnp.where(active, 1.0 - lr * training.mu * prox_scale, 1.0)
        at = jnp.minimum(s, capacity - 1) * batch
        hist_in = jax.lax.dynamic_update_slice_in_dim(hist_in, h, at, axis=0)
        hist_grad = jax.lax.dynamic_update_slice_in_dim(hist_grad, scale * delta, at, axis=0)
        return rest, hist_in, hist_grad, loss_sum + jnp.where(active, loss, 0.0), taken + active

    init = (rest, jnp.zeros((rows_cap, kernel0.shape[0]), jnp.float32),
            jnp.zeros((rows_cap, kernel0.shape[1]), jnp.float32), jnp.zeros((), jnp.float32),
            jnp.zeros((), jnp.int32))
    rest, hist_in, hist_grad, loss_sum, taken = jax.lax.fori_loop(0, loop_length, step, init)
    kernel = kernel0 + jnp.dot(hist_in.T, hist_grad, precision=jax.lax.Precision.HIGHEST)
    trained = {**rest, layer.name: {**rest[layer.name], "kernel": kernel}}
    return trained, loss_sum, taken


def full_gradient(
    apply_fn: ApplyFn,
    data: FederatedData,
    params: PyTree,
    offset: jax.Array,
    count: jax.Array,
    chunk: int,
    loop_length: jax.Array,
) -> tuple[PyTree, jax.Array]:
    """Gradient and value of one client's mean training loss over all its rows (FedSGD),
    accumulated over chunks of `chunk` rows so memory does not grow with the client."""
    def summed_loss(p, xb, yb, mask):
        losses = optax.softmax_cross_entropy_with_integer_labels(apply_fn(p, xb), yb)
        return jnp.sum(losses * mask)

    def body(i, carry):
        grad_sum, loss_sum = carry
        positions, mask = chunk_rows(i, chunk, offset, count)
        rows = data.train_order[positions]
        loss, grad = jax.value_and_grad(summed_loss)(
            params, data.x_train[rows], data.y_train[rows], mask
        )
        return jax.tree.map(jnp.add, grad_sum, grad), loss_sum + loss

    zeros = jax.tree.map(jnp.zeros_like, params)
    grad_sum, loss_sum = jax.lax.fori_loop(
        0, loop_length, body, (zeros, jnp.zeros((), jnp.float32))
    )
    n = jnp.maximum(count, 1).astype(jnp.float32)
    return jax.tree.map(lambda g: g / n, grad_sum), loss_sum / n


# ----------------------------------------------------------------------------------------------
# Blocks: map or reduce a per-client function over the clients of a round.


CLIENT_AXIS = "clients"


def client_mesh(num_devices: Optional[int] = None) -> jax.sharding.Mesh:
    """A 1-D mesh over the first `num_devices` local devices (all by default) whose axis
    shards the clients of every round. Run under ``jax.set_mesh(client_mesh())``: the engine
    then deals blocks of clients to the devices; data and models stay replicated."""
    devices = jax.devices()
    count = len(devices) if num_devices is None else num_devices
    if not 1 <= count <= len(devices):
        raise ValueError(f"devices must be between 1 and {len(devices)} here, got {count}")
    # Auto axis: shard_map reshards the (replicated) client inputs itself.
    return jax.make_mesh((count,), (CLIENT_AXIS,), (jax.sharding.AxisType.Auto,),
                         devices=devices[:count])


def client_shards() -> int:
    """How many devices the clients are sharded over: the size of the current mesh's
    `CLIENT_AXIS` (1 outside a mesh)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or CLIENT_AXIS not in mesh.axis_names:
        return 1
    return int(mesh.shape[CLIENT_AXIS])


def _pad_and_block(inputs: dict, block_size: int, shards: int = 1) -> tuple[dict, int]:
    """Zero-pad every [S, ...] input to a multiple of ``block_size * shards`` and reshape to
    [num_blocks, block_size, ...]. Zero padding makes padded clients no-ops: they have no
    steps and no weight."""
    size = jax.tree.leaves(inputs)[0].shape[0]
    num_blocks = -(-size // block_size)
    num_blocks = -(-num_blocks // shards) * shards
    pad = num_blocks * block_size - size

    def block(x):
        x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
        return x.reshape((num_blocks, block_size) + x.shape[1:])

    return jax.tree.map(block, inputs), size


def _unblock(tree: PyTree, size: int) -> PyTree:
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:])[:size], tree)


def _over_devices(run_blocks: Callable, blocked: dict, shards: int, summed: PyTree = None):
    """``run_blocks(blocked) -> (summed, per_block)`` with the blocks dealt round-robin to
    `shards` devices (block j to device j % shards, so clients sorted by step count spread
    evenly); `summed` outputs are added over devices (``psum``), per-block outputs come back
    in block order. With one shard, just ``run_blocks(blocked)``."""
    if shards == 1:
        return run_blocks(blocked)

    def deal(x):  # [nb, ...] -> [shards, nb / shards, ...]
        return jnp.swapaxes(x.reshape((-1, shards) + x.shape[1:]), 0, 1)

    def collect(x):  # inverse of deal
        return jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:])

    dealt = jax.tree.map(deal, blocked)
    # Arrays the block function closes over (data, models) enter shard_map as
    # explicit replicated arguments: closed-over values are not allowed inside it.
    local_example = jax.tree.map(lambda x: x[0], dealt)
    converted, consts = jax.closure_convert(run_blocks, local_example)

    def per_device(local, consts):
        total, per_block = converted(jax.tree.map(lambda x: x[0], local), *consts)
        total = jax.tree.map(lambda t: jax.lax.psum(t, CLIENT_AXIS), total)
        return total, jax.tree.map(lambda y: y[None], per_block)

    spec = jax.sharding.PartitionSpec(CLIENT_AXIS)
    replicated = jax.sharding.PartitionSpec()
    total, per_block = jax.shard_map(
        per_device, in_specs=(spec, replicated), out_specs=(replicated, spec)
    )(dealt, consts)
    return total, jax.tree.map(collect, per_block)


def map_blocks(block_fn: Callable, inputs: dict, block_size: int) -> PyTree:
    """Apply `block_fn` ([b]-batched inputs -> [b]-batched outputs) block after block (the
    blocks spread over the devices of the current client mesh)."""
    shards = client_shards()
    blocked, size = _pad_and_block(inputs, block_size, shards)
    _, out = _over_devices(lambda bl: ((), jax.lax.map(block_fn, bl)), blocked, shards)
    return _unblock(out, size)


def by_length(one_client: Callable, length_key: str) -> Callable:
    """A block function from `one_client(inp, loop_length, alone)`, which does one client's
    work in `loop_length` iterations: vmapped over the block with the block's longest
    ``inp[length_key]`` (shorter clients mask their extra iterations); a block of one client
    runs without vmap (whose batch-of-one matmuls are slow on CPU) with its own length and
    ``alone=True`` (nothing to mask)."""
    def block_fn(block):
        if block[length_key].shape[0] == 1:
            one = jax.tree.map(lambda x: x[0], block)
            return jax.tree.map(lambda x: x[None], one_client(one, one[length_key], True))
        return jax.vmap(one_client, in_axes=(0, None, None))(
            block, jnp.max(block[length_key]), False)

    return block_fn


def map_clients(block_fn: Callable, inputs: dict, lengths: jax.Array, block_size: int):
    """Per-client outputs of `block_fn` over the clients of `inputs` ([S] each), in their
    order. Clients run longest first (`lengths`: loop iterations each needs), so a block holds
    clients of similar lengths and wastes few masked iterations; blocks of one client on one
    device waste nothing and keep their order, which spares the copy that would put the
    outputs back (FeSEM's start on 500 CNNs: 6.5 GB)."""
    if block_size == 1 and client_shards() == 1:
        return map_blocks(block_fn, inputs, block_size)
    order, inverse = _sorted_by_length(lengths)
    out = map_blocks(block_fn, jax.tree.map(lambda x: x[order], inputs), block_size)
    return jax.tree.map(lambda x: x[inverse], out)


def reduce_clients(block_fn: Callable, inputs: dict, lengths: jax.Array, block_size: int,
                   num_segments: int, like: PyTree):
    """`reduce_blocks` over the clients of `inputs` sorted by `lengths` (see `map_clients`);
    per-client outputs come back in the clients' order."""
    order, inverse = _sorted_by_length(lengths)
    sums, weight_sums, per_client = reduce_blocks(
        block_fn, jax.tree.map(lambda x: x[order], inputs), block_size, num_segments, like)
    return sums, weight_sums, jax.tree.map(lambda x: x[inverse], per_client)


def _sorted_by_length(lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Order putting the longest clients first and its inverse."""
    order = jnp.argsort(-lengths, stable=True)
    return order, jnp.argsort(order)


class BlockSums(NamedTuple):
    """A block function's already-reduced output: per-segment weighted sums [K, ...]."""

    sums: PyTree


def reduce_blocks(
    block_fn: Callable,
    inputs: dict,
    block_size: int,
    num_segments: int,
    like: PyTree,
) -> tuple[PyTree, jax.Array, PyTree]:
    """Run `block_fn` block after block and reduce its per-client tree output on the fly.

    `block_fn` returns ``(tree [b, ...], segment [b], aux [b, ...])``: each client's tree is added,
    times its ``inputs["weight"]``, to the sum of its segment (the segment may be decided inside
    the block, after training: FeSEM's E-step). A block that sums its clients itself returns
    `BlockSums` in place of the tree. Returns the weighted per-segment sums ([K, ...]
    shaped like `like` with a leading K), the summed weights [K], and aux [S, ...]. Only one block
    of client trees is alive at a time.
    """
    shards = client_shards()
    blocked, size = _pad_and_block(inputs, block_size, shards)
    sums0 = jax.tree.map(lambda x: jnp.zeros((num_segments,) + x.shape, jnp.float32), like)

    def body(carry, block):
        sums, weight_sums = carry
        tree, segment, aux = block_fn(block)
        if isinstance(tree, BlockSums):  # the block summed itself (the low-rank path)
            block_sums = tree.sums
            block_weights = segment_sums(block["weight"], segment, block["weight"],
                                         num_segments)[1]
        else:
            block_sums, block_weights = segment_sums(tree, segment, block["weight"],
                                                     num_segments)
        sums = jax.tree.map(jnp.add, sums, block_sums)
        return (sums, weight_sums + block_weights), (segment, aux)

    def run_blocks(blocks):
        return jax.lax.scan(body, (sums0, jnp.zeros((num_segments,), jnp.float32)), blocks)

    (sums, weight_sums), (segments, aux) = _over_devices(run_blocks, blocked, shards)
    return sums, weight_sums, _unblock((segments, aux), size)


def tree_dots(block: PyTree, models: PyTree) -> jax.Array:
    """[b, K] inner products <W_i, M_k> of a block of trees [b, ...] with models [K, ...]."""
    return sum(
        jnp.tensordot(
            w.reshape(w.shape[0], -1), m.reshape(m.shape[0], -1).T, axes=1,
            precision=jax.lax.Precision.HIGHEST,
        )
        for w, m in zip(jax.tree.leaves(block), jax.tree.leaves(models))
    )


def tree_sq_norms(tree: PyTree) -> jax.Array:
    """[n] squared norms of a stacked tree [n, ...]."""
    return sum(jnp.sum(jnp.square(x.reshape(x.shape[0], -1)), axis=1)
               for x in jax.tree.leaves(tree))


def nearest_models(block: PyTree, models: PyTree) -> jax.Array:
    """[b] index of the model nearest each tree in squared L2 (FeSEM's E-step, Eq. 9), without
    forming [b, K, d]: ||W||^2 - 2 <W, M> + ||M||^2."""
    d = tree_sq_norms(models)[None, :] - 2.0 * tree_dots(block, models)
    return jnp.argmin(d, axis=1).astype(jnp.int32)  # ||W||^2 is the same for every k


def segment_sums(tree: PyTree, segments: jax.Array, weights: jax.Array,
                 num_segments: int) -> tuple[PyTree, jax.Array]:
    """Weighted per-segment sums of a stacked tree [n, ...]: ([K, ...] sums of ``w_i x_i`` over
    the rows of each segment, [K] summed weights). A segment outside [0, K) (e.g. -1) counts
    in none. One [n, K] one-hot matmul per leaf: what accelerators do at full speed."""
    mix = jax.nn.one_hot(segments, num_segments) * weights.astype(jnp.float32)[:, None]
    sums = jax.tree.map(
        lambda leaf: jnp.tensordot(mix.T, leaf.astype(jnp.float32), axes=1,
                                   precision=jax.lax.Precision.HIGHEST), tree)
    return sums, jnp.sum(mix, axis=0)


def segment_mean(sums: PyTree, weight_sums: jax.Array, previous: PyTree) -> PyTree:
    """Weighted per-segment means; a segment with no weight keeps its `previous` value."""

    def mean(s, prev):
        w = weight_sums.reshape((-1,) + (1,) * (s.ndim - 1))
        return jnp.where(w > 0, s / jnp.maximum(w, 1e-30), prev).astype(prev.dtype)

    return jax.tree.map(mean, sums, previous)


# ----------------------------------------------------------------------------------------------
# Training a round's clients.


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


def _training_inputs(training, data, selection, weights, segments, prox_scale):
    """The round's per-client inputs ([S] each, in selection order)."""
    steps = client_num_steps(data.train_counts[selection.clients], training)
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
    return inputs


def _training_block_fn(training, data, key, start_models, assign=None, capacity=None,
                       align=None):
    """Per-client training of a block (vmapped; unbatched for a block of one); with a
    `capacity`, the model's large layer is kept factored (`local_train_factored`)."""
    def one_client(inp, loop_length, alone):
        start = jax.tree.map(lambda m: m[inp["start"]], start_models)
        if capacity is None:
            trained, loss_sum, taken = local_train(
                training, data, key, start, start, inp["client"], inp["steps"], loop_length,
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
        return trained, stats

    train_block = by_length(one_client, "steps")  # blocks of one: the CNN's case, 23% faster

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
    path (`mcfl.lowrank`), or None to run per-client models. Decided at trace time from static
    shapes: ``training.low_rank`` "on" forces it (plain SGD on a dense ReLU stack only), "auto"
    takes it when `lowrank.worth_low_rank` says it is cheaper."""
    if training.low_rank == "off":
        return None
    layers = training.dense_layers
    if layers is None and training.factored is not None:
        layers = (training.factored.name,)
    if training.sgd_lr is None or layers is None:
        if training.low_rank == "on":
            raise ValueError("the low-rank path needs plain SGD on a dense (mclr / mlp) model "
                             "or a CNN")
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
        def train(loop_length):
            return lowrank.train_block(
                layers, training.sgd_lr, training.mu, training.batch_size, capacity, data, key,
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
    entry points. Clients with gradient corrections train on the per-client path."""
    inputs = _training_inputs(training, data, selection, weights, segments, prox_scale)
    capacity = (None if selection.correction is not None
                else low_rank_capacity(training, data, start_models))
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
    block_size: int,
    prox_scale: jax.Array | float = 1.0,
    features: Optional[Callable[[PyTree], jax.Array]] = None,
) -> tuple[PyTree, ClientStats]:
    """Train the selected clients, each from ``start_models[start_index]`` (also its proximal
    anchor), and return their trained models stacked [S, ...] in selection order; with
    `features` (a block of models [b, ...] -> [b, f]), each block's features instead, so that
    the models of all S clients are never held at once (FeSEM's and Robust's start: the
    clients' flattened models, [S, d])."""
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
    block_size: int,
    prox_scale: jax.Array | float = 1.0,
    assign: Optional[Callable[[PyTree], jax.Array]] = None,
    align: Optional[Callable[[PyTree, jax.Array], PyTree]] = None,
) -> tuple[PyTree, jax.Array, jax.Array, ClientStats]:
    """Train the selected clients and return weighted per-segment sums of their models
    ([K, ...]), the per-segment weight sums [K], each client's segment [S] and per-client stats
    [S], in selection order. Client models are never all alive at once: only one block of them.

    A client's segment is ``segments[i]``, or, with `assign`, ``assign(trained_block)`` computed
    after training (FeSEM's E-step on the freshly trained models). With `align`, the block's
    models are replaced by ``align(trained_block, segment)`` before they are summed (FeSEM-MA's
    matched averaging).
    """
    inputs, block_fn = _prepare_training(
        training, data, key, start_models, selection, weights, segments, prox_scale, assign,
        sum_in_block=num_segments == 1, align=align,
    )
    like = jax.tree.map(lambda m: m[0], start_models)
    sums, weight_sums, (segment, stats) = reduce_clients(
        block_fn, inputs, inputs["steps"], block_size, num_segments, like
    )
    return sums, weight_sums, segment, stats


def gradients_and_aggregate(
    apply_fn: ApplyFn,
    data: FederatedData,
    start_models: PyTree,
    selection: RoundClients,
    weights: jax.Array,
    segments: jax.Array,
    num_segments: int,
    block_size: int,
    chunk: int,
) -> tuple[PyTree, jax.Array, jax.Array]:
    """FedSGD's client work: each selected client's full-batch gradient at its start model,
    reduced into weighted per-segment sums. Returns (sums, weight_sums, loss [S])."""
    counts = data.train_counts[selection.clients]
    inputs = {
        "client": selection.clients,
        "start": selection.start_index,
        "chunks": ceil_div(counts, chunk),
        "weight": weights.astype(jnp.float32),
        "segment": segments,
    }

    gradient_block = by_length(_gradient_of_client(apply_fn, data, start_models, chunk), "chunks")

    def block_fn(block):
        grads, loss = gradient_block(block)
        return grads, block["segment"], loss

    like = jax.tree.map(lambda m: m[0], start_models)
    sums, weight_sums, (_, loss) = reduce_clients(block_fn, inputs, inputs["chunks"], block_size,
                                                  num_segments, like)
    return sums, weight_sums, loss


def client_gradients(
    apply_fn: ApplyFn,
    data: FederatedData,
    start_models: PyTree,
    selection: RoundClients,
    block_size: int,
    chunk: int = CLIENT_ROWS_CHUNK,
) -> tuple[PyTree, jax.Array]:
    """Each selected client's full-batch gradient of its mean training loss at its start model,
    stacked [S, ...] in selection order, and its loss [S] (FedDANE's first exchange)."""
    counts = data.train_counts[selection.clients]
    inputs = {"client": selection.clients, "start": selection.start_index,
              "chunks": ceil_div(counts, chunk)}
    block_fn = by_length(_gradient_of_client(apply_fn, data, start_models, chunk), "chunks")
    return map_clients(block_fn, inputs, inputs["chunks"], block_size)


def _gradient_of_client(apply_fn, data, start_models, chunk):
    def one_client(inp, loop_length, alone):
        del alone  # rows past the client's end are masked in every chunk anyway
        params = jax.tree.map(lambda m: m[inp["start"]], start_models)
        return full_gradient(apply_fn, data, params, data.train_offsets[inp["client"]],
                             data.train_counts[inp["client"]], chunk, loop_length)

    return one_client


def losses_of_models(
    apply_fn: ApplyFn,
    data: FederatedData,
    models: PyTree,
    clients: jax.Array,
    block_size: int,
    chunk: int = CLIENT_ROWS_CHUNK,
) -> jax.Array:
    """[S, K] mean training loss of each of the K `models` on each client's training rows
    (IFCA's cluster identity estimate, Ghosh et al. 2020, Alg. 1), in chunks of `chunk` rows."""
    def one_client(inp, loop_length, alone):
        del alone  # rows past the client's end are masked in every chunk anyway
        offset, count = data.train_offsets[inp["client"]], data.train_counts[inp["client"]]

        def body(i, total):
            positions, mask = chunk_rows(i, chunk, offset, count)
            rows = data.train_order[positions]
            x, y = data.x_train[rows], data.y_train[rows]

            def summed(params):
                losses = optax.softmax_cross_entropy_with_integer_labels(apply_fn(params, x), y)
                return jnp.sum(losses * mask)

            return total + jax.vmap(summed)(models)

        num_models = jax.tree.leaves(models)[0].shape[0]
        total = jax.lax.fori_loop(0, loop_length, body, jnp.zeros((num_models,), jnp.float32))
        return total / jnp.maximum(count, 1)

    inputs = {"client": clients, "chunks": ceil_div(data.train_counts[clients], chunk)}
    return map_clients(by_length(one_client, "chunks"), inputs, inputs["chunks"], block_size)


# ----------------------------------------------------------------------------------------------
# Evaluation counts.


class EvalCounts(NamedTuple):
    """Per-client test counts, from which accuracy and F1 follow (all on the host)."""

    loss_sum: jax.Array  # [C]
    correct: jax.Array  # [C]
    true_pos: jax.Array  # [C, num_classes]
    false_pos: jax.Array  # [C, num_classes]
    false_neg: jax.Array  # [C, num_classes]


# Models shared by many clients (one global model, K clusters) are evaluated row chunk by row
# chunk, each chunk holding rows of one model; above this many models (Local: one per client)
# each client is evaluated with its own model instead.
MAX_SHARED_EVAL_MODELS = 64


def evaluate_counts(
    apply_fn: ApplyFn,
    data: FederatedData,
    models: PyTree,
    model_index: jax.Array,
    block_size: int,
    eval_batch: int = DEFAULT_EVAL_BATCH,
    split: str = "test",
) -> EvalCounts:
    """Evaluate every client on its own `split` rows with ``models[model_index[i]]``.

    The work is linear in the split's rows: with at most `MAX_SHARED_EVAL_MODELS` models the
    rows are grouped by their client's model and cut into chunks of `eval_batch` rows of one
    model each (at most N / eval_batch + M chunks); otherwise clients are evaluated one model
    each, in blocks of clients with similar row counts and chunks of at most
    `CLIENT_ROWS_CHUNK` of a client's rows.
    """
    num_models = jax.tree.leaves(models)[0].shape[0]
    if num_models <= MAX_SHARED_EVAL_MODELS:
        return _evaluate_by_model(apply_fn, data, models, model_index, block_size, eval_batch,
                                  split)
    return _evaluate_by_client(apply_fn, data, models, model_index, block_size,
                               min(eval_batch, CLIENT_ROWS_CHUNK), split)


def _split_arrays(data: FederatedData, split: str):
    if split == "test":
        return (data.x_test, data.y_test, data.test_owner, data.test_offsets, data.test_counts,
                data.test_order)
    return (data.x_train, data.y_train, data.train_owner, data.train_offsets, data.train_counts,
            data.train_order)


def _counts_from_rows(owner, labels, pred, loss, valid, num_clients: int, num_classes: int):
    """Per-client EvalCounts from per-row predictions (rows of owner C, nobody, and invalid
    rows are left out): scatter-adds, linear in the rows."""
    owner = jnp.where(valid, owner, num_clients)  # row C of the sums is dropped
    hit = (pred == labels) & valid
    size = (num_clients + 1, num_classes)
    per_class = lambda cls, w: jnp.zeros(size, jnp.float32).at[owner, cls].add(w)[:-1]  # noqa: E731
    tp = per_class(labels, hit.astype(jnp.float32))
    predicted = per_class(pred, valid.astype(jnp.float32))
    actual = per_class(labels, valid.astype(jnp.float32))
    per_client = lambda w: jnp.zeros((num_clients + 1,), jnp.float32).at[owner].add(w)[:-1]  # noqa: E731
    return EvalCounts(
        loss_sum=per_client(jnp.where(valid, loss, 0.0)),
        correct=per_client(hit.astype(jnp.float32)),
        true_pos=tp,
        false_pos=predicted - tp,
        false_neg=actual - tp,
    )


def _evaluate_by_model(apply_fn, data, models, model_index, block_size, chunk, split):
    x, y, owner, _, _, _ = _split_arrays(data, split)
    num_rows, c = y.shape[0], data.num_clients
    num_models = jax.tree.leaves(models)[0].shape[0]
    held = owner < c
    row_model = jnp.where(held, model_index[jnp.minimum(owner, c - 1)], num_models)
    by_model = jnp.argsort(row_model, stable=True).astype(jnp.int32)  # rows of model m together
    rows_per_model = jnp.zeros((num_models + 1,), jnp.int32).at[row_model].add(1)[:num_models]
    chunks_per_model = ceil_div(rows_per_model, chunk)
    chunk_end = jnp.cumsum(chunks_per_model)  # [M] chunks up to and including model m
    row_start = jnp.cumsum(rows_per_model) - rows_per_model
    num_chunks = num_rows // chunk + num_models + 1  # static bound on the chunks needed
    j = jnp.arange(num_chunks, dtype=jnp.int32)
    model_of = jnp.minimum(jnp.searchsorted(chunk_end, j, side="right"), num_models - 1)
    local = j - (chunk_end[model_of] - chunks_per_model[model_of])
    inputs = {
        "model": model_of.astype(jnp.int32),
        "start": row_start[model_of] + local * chunk,
        "count": jnp.clip(rows_per_model[model_of] - local * chunk, 0, chunk),
    }

    def one_chunk(inp):
        params = jax.tree.map(lambda m: m[inp["model"]], models)
        positions = inp["start"] + jnp.arange(chunk, dtype=jnp.int32)
        rows = by_model[jnp.minimum(positions, num_rows - 1)]
        logits = apply_fn(params, x[rows])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y[rows])
        valid = jnp.arange(chunk) < inp["count"]
        return rows, jnp.argmax(logits, -1).astype(jnp.int32), loss, valid

    rows, pred, loss, valid = map_blocks(jax.vmap(one_chunk), inputs, block_size)
    rows, pred, loss, valid = (a.reshape(-1) for a in (rows, pred, loss, valid))
    return _counts_from_rows(owner[rows], y[rows], pred, loss, valid, c, data.num_classes)


def _evaluate_by_client(apply_fn, data, models, model_index, block_size, eval_batch, split):
    x, y, _, offsets, counts, order = _split_arrays(data, split)
    nc = data.num_classes

    def one_client(inp, loop_length, alone):
        del alone  # rows past the client's end are masked in every chunk anyway
        params = jax.tree.map(lambda m: m[inp["model"]], models)
        offset, count = offsets[inp["client"]], counts[inp["client"]]

        def body(i, acc):
            positions, mask = chunk_rows(i, eval_batch, offset, count)
            rows = order[positions]
            logits = apply_fn(params, x[rows])
            labels = y[rows]
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
            pred = jax.nn.one_hot(jnp.argmax(logits, -1), nc) * mask[:, None]
            true = jax.nn.one_hot(labels, nc) * mask[:, None]
            tp = jnp.sum(pred * true, 0)
            return EvalCounts(
                acc.loss_sum + jnp.sum(losses * mask),
                acc.correct + jnp.sum(tp),
                acc.true_pos + tp,
                acc.false_pos + jnp.sum(pred, 0) - tp,
                acc.false_neg + jnp.sum(true, 0) - tp,
            )

        zero = jnp.zeros((), jnp.float32)
        zeros = jnp.zeros((nc,), jnp.float32)
        return jax.lax.fori_loop(0, loop_length, body, EvalCounts(zero, zero, zeros, zeros, zeros))

    inputs = {
        "client": jnp.arange(data.num_clients, dtype=jnp.int32),
        "model": model_index.astype(jnp.int32),
        "chunks": ceil_div(counts, eval_batch),
    }
    return map_clients(by_length(one_client, "chunks"), inputs, inputs["chunks"], block_size)


def default_block_size(num_params: int, num_clients: int, backend: Optional[str] = None,
                       low_rank: bool = False) -> int:
    """Clients per vmapped block.

    On CPU, small blocks: a block runs as long as its longest client, so with clients sorted by
    step count, small blocks waste the fewest masked steps, and their models stay in cache.
    Measured on 2 CPU cores, FedAvg over all 1,000 Synthetic clients (MCLR): block 1: 0.73 s a
    round, 4: 0.45, 8: 0.40, 16: 0.45, 32: 0.54, 128: 1.49, 1,000: 8.4 (BENCHMARKS.md).
    The low-rank path (`mcfl.lowrank`) keeps no per-client model, only a short history per
    client, and wants blocks big enough that its shared matmuls run at full speed: 50 on CPU.
    On GPU / TPU, large blocks (up to ~256 MB of parameters each) to fill the device.
    """
    backend = backend or jax.default_backend()
    if backend == "cpu":
        cap, budget = (50, 1 << 26) if low_rank else (8, 1 << 22)  # bytes of params per block
    else:
        cap, budget = 1024, 1 << 28
    size = max(1, budget // max(1, 4 * num_params))
    return int(max(1, min(num_clients, size, cap)))
