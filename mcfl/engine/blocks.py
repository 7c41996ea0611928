"""Blocks: map or reduce a per-client function over the clients of a round.

Clients of a round are sorted by their number of local steps (or row chunks) and cut into
blocks of `block_size`. Blocks run one after another (`lax.scan` / `lax.map`); inside a block
the clients run together (`vmap`) for as long as the block's longest client. Memory stays at one
block of client outputs (plus the outputs asked for). Under a client mesh
(`client_mesh`, `jax.set_mesh`) the blocks are dealt over its devices.

How many clients a block holds is the execution plan's choice (`mcfl.runs.execution`), not the
algorithm's: it reaches the round primitives as their `block_size` argument (an algorithm has it
from its `AlgorithmContext`); where none is given, `default_block_size` applies to the models
and clients at hand. The block size changes speed and memory, not what is computed (to float
rounding: tests/test_sharding.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from mcfl.engine.segments import segment_sums
from mcfl.engine.training import PyTree

CLIENT_AXIS = "clients"

def block_size_for(models: PyTree, num_clients: int, explicit: Optional[int] = None) -> int:
    """The block size of round work on `num_clients` clients with stacked `models` [M, ...]:
    `explicit` if given, else `default_block_size` for their size."""
    if explicit is not None:
        return explicit
    leaves = jax.tree.leaves(models)
    num_params = sum(leaf.size // leaf.shape[0] for leaf in leaves)
    return default_block_size(num_params, num_clients)


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
    """Zero-pad every [S, ...] input and reshape it to [num_blocks, block, ...]: as few blocks
    of at most `block_size` as cover S, a multiple of `shards` of them, evened out (`even_block`).
    Zero padding makes padded clients no-ops: they have no steps and no weight."""
    size = jax.tree.leaves(inputs)[0].shape[0]
    block_size = even_block(size, block_size, shards)
    num_blocks = -(-size // block_size)
    num_blocks = -(-num_blocks // shards) * shards
    pad = num_blocks * block_size - size

    def block(x):
        x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
        return x.reshape((num_blocks, block_size) + x.shape[1:])

    return jax.tree.map(block, inputs), size


def even_block(size: int, block_size: int, shards: int = 1) -> int:
    """The block that covers `size` items in as few blocks of at most `block_size` per device
    as there must be, with the least padding: ``ceil(size / (shards * n))`` for n =
    ``ceil(size / (shards * block_size))`` blocks a device. A block larger than a device's
    share only pads: the accelerators' blocks (up to 1,024) made FedAvg's evaluation of
    2,000 clients' MLP on a TPU v5e 3.4x its work (BENCHMARKS.md, "Colab TPUs from the TPU
    compiler")."""
    per_device = max(1, -(-size // max(1, shards * block_size)))
    return max(1, min(block_size, -(-size // (shards * per_device))))


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


LOOP_SCOPE = "mcfl_loop_"
OCCASIONAL_SCOPE = "mcfl_occasional"


def loop_scope(length_key: str):
    """The name scope of a loop over a client's `length_key` iterations (its local steps, its
    chunks of rows): `mcfl.planning.cost` finds its loops by it, to count each as often as it
    runs."""
    return jax.named_scope(LOOP_SCOPE + length_key)


def occasional_cond(pred, true_fn: Callable, false_fn: Callable, *operands):
    """``lax.cond`` for work a round does only now and then (FlexCFL's newcomers' pre-training,
    a migration, a clustering round): `mcfl.planning.cost` counts it at its cheaper branch, so a
    round's count stays a lower bound on the rounds that skip it."""
    with jax.named_scope(OCCASIONAL_SCOPE):
        return jax.lax.cond(pred, true_fn, false_fn, *operands)


def by_length(one_client: Callable, length_key: str, scope: Optional[str] = None) -> Callable:
    """A block function from `one_client(inp, loop_length, alone)`, which does one client's
    work in `loop_length` iterations: vmapped over the block with the block's longest
    ``inp[length_key]`` (shorter clients mask their extra iterations); a block of one client
    runs without vmap (whose batch-of-one matmuls are slow on CPU) with its own length and
    ``alone=True`` (nothing to mask). `scope`: the loop's name for `mcfl.planning.cost` (default
    `length_key`)."""
    def block_fn(block):
        with loop_scope(scope or length_key):
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


# Clients per CPU block when no block wastes a step (`default_block_size`).
UNIFORM_STEPS_CPU_CAP = 128


def default_block_size(num_params: int, num_clients: int, backend: Optional[str] = None,
                       low_rank: bool = False, uniform_steps: bool = False) -> int:
    """Clients per vmapped block.

    On CPU, small blocks: a block runs as long as its longest client, so with clients sorted by
    step count, small blocks waste the fewest masked steps, and their models stay in cache.
    Measured on 2 CPU cores, FedAvg over all 1,000 Synthetic clients (MCLR): block 1: 0.73 s a
    round, 4: 0.45, 8: 0.40, 16: 0.45, 32: 0.54, 128: 1.49, 1,000: 8.4 (BENCHMARKS.md).
    With `uniform_steps` (every client of a round trains the same number of steps: a fixed
    ``local_steps``, or equal ``ceil(n_i / B)``) no block wastes a step, and a block's cost is
    mostly the per-operation cost of its steps: up to `UNIFORM_STEPS_CPU_CAP` clients, within
    the same 4 MB of parameters (small models only).
    The low-rank path (`mcfl.engine.lowrank`) keeps no per-client model, only a short history per
    client, and wants blocks big enough that its shared matmuls run at full speed: 50 on CPU.
    On GPU / TPU, large blocks (up to ~256 MB of parameters each) to fill the device; on the
    low-rank path up to 1 GB of parameters' worth (at most 1,024 clients), since its clients
    hold histories, not models: on an H200, FedAvg with the MLP 784-200-200-10, 1,000 clients a
    round of 5 steps, ran 0.0058 s a round in blocks of 336 (the 256 MB rule), 0.0049 in 512
    and 0.0044 in one block of 1,000 (BENCHMARKS.md, `benchmarks/device_check.sh`).
    """
    backend = backend or jax.default_backend()
    if backend == "cpu":
        if low_rank:
            cap, budget = 50, 1 << 26  # bytes of params per block
        else:
            cap, budget = (UNIFORM_STEPS_CPU_CAP if uniform_steps else 8), 1 << 22
    else:
        cap, budget = 1024, (1 << 30) if low_rank else (1 << 28)
    size = max(1, budget // max(1, 4 * num_params))
    return int(max(1, min(num_clients, size, cap)))
