"""Per-client rows as a client store keeps them (`mcfl.store`, and the device's own rows in
`mcfl.algorithms.framework.device`), and how a chunk of stored rows is evaluated.

An algorithm that keeps something per client (Local's models; personal models, control
variates) describes it in its `ClientState` (`mcfl.algorithms.framework.base`): a round receives
the rows of its clients in its `Exchange` and returns them trained. The rows live where the run's
client store puts them: in the run's state on the device, or in host memory or on disk, read and
written one round at a time. Every store runs the same round function on the same rows, so the
stores give the same results.

Rows are stored in the store's dtype (float32, or bfloat16 to halve the memory: floating
leaves only) and trained in float32: the cast to storage happens in the jitted round, so
every store rounds the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from mcfl.algorithms.framework.base import ClientState
from mcfl.engine import evaluate_clients


def to_storage(rows, dtype_name: str):
    """Rows as stored: floating leaves in the storage dtype, others as they are. bfloat16
    values are kept as their uint16 bit patterns: gathers and scatters of whole rows then move
    bits, where XLA:CPU would widen a bfloat16 array to float32 to scatter into it (a round on
    5,000 stored MLPs: 2.5 s against 0.2 s)."""
    def stored(x):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        if dtype_name == "bfloat16":
            return jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
        return x.astype(jnp.float32)

    return jax.tree.map(stored, rows)


def to_training(rows, like):
    """Stored rows back in the dtypes of `like` (float32 for training)."""
    def back(x, ref):
        if x.dtype == jnp.uint16 and jnp.issubdtype(ref.dtype, jnp.floating):
            x = jax.lax.bitcast_convert_type(x, jnp.bfloat16)  # bfloat16's bits
        return x.astype(ref.dtype)

    return jax.tree.map(back, rows, like)


def at_storage_precision(x: jax.Array, dtype_name: str) -> jax.Array:
    """`x` rounded as a store of `dtype_name` keeps it, back in its own dtype (a population
    start's models on the device are rounded as a host or disk store rounds them)."""
    return to_training(to_storage(x, dtype_name), x)


def with_fresh(client_state: ClientState, initial, stored, written, clients):
    """Stored rows [b] with those never written (`written` [b] false) made fresh from the
    initial state, in the storage dtype."""
    fresh = to_storage(client_state.fresh(initial, clients), client_state.dtype)
    return jax.tree.map(
        lambda s, f: jnp.where(written.reshape((-1,) + (1,) * (s.ndim - 1)), s, f),
        stored, fresh)


# Clients evaluated together: their models, in float32, take at most this many bytes.
EVAL_CHUNK_BYTES = 1 << 28


def evaluated_floats(client_state: ClientState, state) -> int:
    """Floats of one client's row or of the model it is evaluated with, whichever is more
    (FedEM's row is K weights, its evaluated model K components): what a chunk of clients
    holds at once when it is evaluated."""
    def one(s):
        clients = jnp.zeros((1,), jnp.int32)
        rows = client_state.fresh(s, clients)
        return rows, client_state.models(s, rows, clients)

    rows, models = jax.eval_shape(one, state)
    return max(sum(x.size for x in jax.tree.leaves(rows)),
               sum(x.size for x in jax.tree.leaves(models)))


def evaluation_chunk(num_clients: int, row_floats: int) -> int:
    """Clients per evaluation chunk of a store's rows (every store uses the same, so that
    they compute the same numbers)."""
    return max(1, min(num_clients, EVAL_CHUNK_BYTES // max(4 * row_floats, 1)))


def fresh_like(client_state: ClientState, state):
    """One fresh row [1, ...] in training dtypes: what stored rows are cast back to."""
    return client_state.fresh(state, jnp.zeros((1,), jnp.int32))


def evaluate_rows(client_state: ClientState, apply_fn, block_size: int, state, initial,
                  stored, written, clients, data):
    """[b] evaluation counts of a block of clients, each with the model its row gives
    (`ClientState.models`)."""
    rows = with_fresh(client_state, initial, stored, written, clients)
    like = client_state.fresh(initial, clients[:1])
    models = client_state.models(state, to_training(rows, like), clients)
    return evaluate_clients(apply_fn, data, models, clients, block_size)


def counts_in_chunks(chunk_counts: Callable, num_clients: int, row_floats: int):
    """[C] evaluation counts of every client, from ``chunk_counts(clients [chunk])`` over
    chunks of `evaluation_chunk` clients (the last padded with the last client)."""
    chunk = evaluation_chunk(num_clients, row_floats)
    starts = jnp.arange(-(-num_clients // chunk), dtype=jnp.int32) * chunk

    def one_chunk(lo):
        return chunk_counts(jnp.minimum(lo + jnp.arange(chunk, dtype=jnp.int32),
                                        num_clients - 1))

    counts = jax.lax.map(one_chunk, starts)  # [num_chunks, chunk, ...]
    return jax.tree.map(lambda c: c.reshape((-1,) + c.shape[2:])[:num_clients], counts)
