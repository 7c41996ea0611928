"""Per-client state kept as rows of a client store (`mcfl.store`), read and written per round.

An algorithm that keeps something per client (Local's models; personal models, control
variates) describes it as `ClientRows`: the rows of a round's clients are gathered, the round
runs on them and on the algorithm's shared state, and the trained rows are written back. The
rows live where the run's client store puts them: in the algorithm's state on the device
(`with_client_rows` builds that algorithm: gather, round, scatter in one jitted function, so
`scan_rounds` works), or in host memory or on disk, one round at a time (`mcfl.store`), where
the same `ClientRows.round` runs on rows the host gathered. Both run the same round function
on the same rows, so the stores give the same results.

Rows are stored in the store's dtype (float32, or bfloat16 to halve the memory: floating
leaves only) and trained in float32: the cast to storage happens in the jitted round, so
every store rounds the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.algorithms.base import FederatedAlgorithm
from mcfl.engine import evaluate_clients
from mcfl.sampling import round_clients


class ClientRows(NamedTuple):
    """What an algorithm keeps per client, as functions of its shared state (`init_shared`'s
    result, carried by the rounds) and a block of clients' rows ([b, ...] pytrees, float32).

    * ``init_shared(data, key, hp) -> shared``;
    * ``fresh(shared, clients [b]) -> rows``: the rows of clients that never trained, from the
      shared state right after `init_shared` (Local: the common start W_0);
    * ``sample(data, key) -> clients [S]``: the clients whose rows round `key` reads and
      writes (known before the round runs, so a store can fetch them early);
    * ``round(shared, rows [S], clients, data, key, hp) -> (shared, rows [S], metrics)``;
    * ``models(shared, rows [b], clients [b]) -> models [b, ...]``: the model each of a block
      of clients is evaluated with.
    """

    init_shared: Callable
    fresh: Callable
    sample: Callable
    round: Callable
    models: Callable


def sampled_each_round(clients_per_round: int) -> Callable:
    """`ClientRows.sample` of the algorithms whose round samples its clients with the first
    half of the round key (`round_clients`, as FedAvg does)."""
    def sample(data, key):
        return round_clients(data, jax.random.split(key)[0], clients_per_round)

    return sample


class StoredState(flax.struct.PyTreeNode):
    """An algorithm's state with its client rows on the device: `shared`, and `rows` [C, ...]
    in the storage dtype."""

    shared: Any
    rows: Any


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


def stored_round(client_rows: ClientRows, dtype_name: str, shared, stored, clients, data, key,
                 hp, like):
    """One round on stored rows [S] (in the storage dtype): (shared, stored rows [S],
    metrics). `like`: rows in training dtypes (shapes ignored) to cast back to."""
    shared, rows, metrics = client_rows.round(shared, to_training(stored, like), clients, data,
                                              key, hp)
    return shared, to_storage(rows, dtype_name), metrics


def with_client_rows(name: str, client_rows: ClientRows, dtype_name: str = "float32",
                     assignments=None, evaluation_apply=None,
                     trainable_models=None) -> FederatedAlgorithm:
    """The algorithm with its rows [C, ...] in its state on the device (the `device` store);
    `assignments(shared)`: each client's cluster, for a clustered algorithm (which then also
    gives `trainable_models(shared)`, the model parameters the closing embedding trains each
    client from: `FederatedAlgorithm.trainable_models`); `evaluation_apply`: the apply of
    `ClientRows.models`' models when it is not the model's own."""

    def init(data, key, hp):
        shared = client_rows.init_shared(data, key, hp)
        clients = jnp.arange(data.num_clients, dtype=jnp.int32)
        return StoredState(shared, to_storage(client_rows.fresh(shared, clients), dtype_name))

    def fresh_like(shared):
        return client_rows.fresh(shared, jnp.zeros((1,), jnp.int32))

    def round_(state, data, key, hp):
        clients = client_rows.sample(data, key)
        stored = jax.tree.map(lambda all_rows: all_rows[clients], state.rows)
        shared, new, metrics = stored_round(client_rows, dtype_name, state.shared, stored,
                                            clients, data, key, hp, fresh_like(state.shared))
        rows = jax.tree.map(lambda all_rows, r: all_rows.at[clients].set(r), state.rows, new)
        return StoredState(shared, rows), metrics

    def client_models(state):
        num_clients = jax.tree.leaves(state.rows)[0].shape[0]
        clients = jnp.arange(num_clients, dtype=jnp.int32)
        rows = to_training(state.rows, fresh_like(state.shared))
        return client_rows.models(state.shared, rows, clients), clients

    wrapped_assignments = None
    if assignments is not None:
        wrapped_assignments = lambda state: assignments(state.shared)  # noqa: E731
    trainable = None
    if trainable_models is not None:
        trainable = lambda state: trainable_models(state.shared)  # noqa: E731
    return FederatedAlgorithm(name, init, round_, client_models, wrapped_assignments,
                              client_rows=client_rows, store_dtype=dtype_name,
                              evaluation_apply=evaluation_apply, trainable_models=trainable)


def with_fresh(client_rows: ClientRows, dtype_name: str, initial, stored, written, clients):
    """Stored rows [b] with those never written (`written` [b] false) made fresh from the
    initial shared state, in the storage dtype."""
    fresh = to_storage(client_rows.fresh(initial, clients), dtype_name)
    return jax.tree.map(
        lambda s, f: jnp.where(written.reshape((-1,) + (1,) * (s.ndim - 1)), s, f),
        stored, fresh)


# Clients evaluated together: their models, in float32, take at most this many bytes.
EVAL_CHUNK_BYTES = 1 << 28


def evaluated_floats(client_rows: ClientRows, shared) -> int:
    """Floats of one client's row or of the model it is evaluated with, whichever is more
    (FedEM's row is K weights, its evaluated model K components): what a chunk of clients
    holds at once when it is evaluated."""
    def one(s):
        clients = jnp.zeros((1,), jnp.int32)
        rows = client_rows.fresh(s, clients)
        return rows, client_rows.models(s, rows, clients)

    rows, models = jax.eval_shape(one, shared)
    return max(sum(x.size for x in jax.tree.leaves(rows)),
               sum(x.size for x in jax.tree.leaves(models)))


def evaluation_chunk(num_clients: int, row_floats: int) -> int:
    """Clients per evaluation chunk of a store's rows (every store uses the same, so that
    they compute the same numbers)."""
    return max(1, min(num_clients, EVAL_CHUNK_BYTES // max(4 * row_floats, 1)))


def evaluate_rows(client_rows: ClientRows, dtype_name: str, apply_fn, block_size: int, shared,
                  initial, stored, written, clients, data):
    """[b] evaluation counts of a block of clients, each with the model its row gives
    (`ClientRows.models`)."""
    rows = with_fresh(client_rows, dtype_name, initial, stored, written, clients)
    like = client_rows.fresh(initial, clients[:1])
    models = client_rows.models(shared, to_training(rows, like), clients)
    return evaluate_clients(apply_fn, data, models, clients, block_size)


def evaluate_device_rows(algorithm: FederatedAlgorithm, apply_fn, block_size: int,
                         state: StoredState, data):
    """Every client's evaluation counts from rows held on the device ([C, ...] in `state`),
    chunk by chunk as a host or disk store evaluates them (`evaluation_chunk`)."""
    client_rows, dtype_name = algorithm.client_rows, algorithm.store_dtype
    row_floats = evaluated_floats(client_rows, state.shared)

    def chunk_counts(clients):
        stored = jax.tree.map(lambda r: r[clients], state.rows)
        return evaluate_rows(client_rows, dtype_name, apply_fn, block_size, state.shared,
                             state.shared, stored, jnp.ones(clients.shape, bool), clients, data)

    return counts_in_chunks(chunk_counts, data.num_clients, row_floats)


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


def evaluate_personalised(algorithm: FederatedAlgorithm, apply_fn, block_size: int, state,
                          data):
    """Every client's evaluation counts with the model `algorithm.personalised` makes for it
    from the state and its data (Per-FedAvg's one step), chunk by chunk."""
    models, _ = algorithm.client_models(state)
    row_floats = sum(x[0].size for x in jax.tree.leaves(models))

    def chunk_counts(clients):
        return evaluate_clients(apply_fn, data, algorithm.personalised(state, clients, data),
                                clients, block_size)

    return counts_in_chunks(chunk_counts, data.num_clients, row_floats)
