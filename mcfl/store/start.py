"""A population start through a client store: every client trains once, in chunks, its
features go to the store, and the clustering reads them back chunk by chunk.

FeSEM's and Robust's initialisation (`base.PopulationStart`) needs every client's trained
model at once: [C, d] floats, 48 GB for 60,000 clients of a 199,210-parameter MLP. Here the
clients train `START_CHUNK_BYTES` worth at a time, the features are written to a store of the
run's kind (host memory or disk, `start/` in the store folder), and the algorithm's `finish`
clusters them as a `StoreSource` (`mcfl.clustering.streamed.RowSource`). The features are
deleted once the state is made.

The clustering equals the in-memory one (`mcfl.clustering.streamed`: the same seeds, the same
iterations) up to rounding, which only decides between clusterings of exactly equal cost (one
outlier trimmed or alone in a cluster, the other way round): there the chunked sums and the
in-memory ones may choose differently.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mcfl import engine
from mcfl.algorithms import hyperparams
from mcfl.store.stores import make_store

# Features of the clients trained together, at most (float32).
START_CHUNK_BYTES = 1 << 28


class StoreSource:
    """One member's rows of a store of float32 feature rows, as a `RowSource`."""

    def __init__(self, store, member: int, dim: int, chunk: int):
        self.store, self.member, self.dim, self.chunk = store, member, dim, chunk
        self.num_rows = store.clients

    def chunks(self):
        for lo in range(0, self.num_rows, self.chunk):
            hi = min(lo + self.chunk, self.num_rows)
            rows, _ = self.store.chunk(self.member, lo, hi)
            yield lo, rows.view(np.float32).reshape(hi - lo, self.dim)

    def rows(self, index: np.ndarray) -> np.ndarray:
        index = np.asarray(index, np.int64)
        members = np.full((self.store.members, index.size), 0, np.int64)
        members[self.member] = index
        packed, _ = self.store.gather(members)
        return packed[self.member].view(np.float32).reshape(index.size, self.dim)

    def columns(self, lo: int, hi: int) -> np.ndarray:
        return np.concatenate([rows[:, lo:hi] for _, rows in self.chunks()], axis=0)


def streamed_start(program, values, init_keys, data, members: int):
    """The initial state of `program`'s algorithm (its `PopulationStart`) for each member,
    with the clients' features in a `program.kind` store; stacked [M] when `program.members`."""
    start = program.algorithm.population_start
    config, plan = program.config, program.plan
    num_clients = int(data.num_clients)
    keys = init_keys if program.members else init_keys[None]

    def member_values(m):
        return {k: v[m] for k, v in values.items()}

    def points(values_m, key, data, clients):
        return start.points(data, key, hyperparams(config, plan.model, values_m), clients)

    points_fn = jax.jit(points)
    with engine.planned_block_size(plan.train_block):  # as the in-memory start is traced
        return _train_and_cluster(program, start, points_fn, member_values, keys, data,
                                  members, num_clients)


def _train_and_cluster(program, start, points_fn, member_values, keys, data, members: int,
                       num_clients: int):
    config, plan = program.config, program.plan
    width = jax.eval_shape(points_fn, member_values(0), keys[0], data,
                           jax.ShapeDtypeStruct((1,), jnp.int32)).shape[1]
    chunk = max(1, min(num_clients, START_CHUNK_BYTES // (4 * width)))
    folder = None if program.folder is None else program.folder / "start"
    store = make_store(program.kind, members, num_clients, 4 * width, folder)
    try:
        for lo in range(0, num_clients, chunk):
            clients = np.minimum(np.arange(lo, lo + chunk), num_clients - 1)
            rows = np.stack([np.asarray(jax.device_get(points_fn(
                member_values(m), keys[m], data, jnp.asarray(clients, jnp.int32))), np.float32)
                for m in range(members)])
            kept = min(chunk, num_clients - lo)
            store.scatter(np.broadcast_to(clients[:kept], (members, kept)).copy(),
                          rows[:, :kept].view(np.uint8), 1)
        states = [start.finish(data, keys[m],
                               hyperparams(config, plan.model, member_values(m)),
                               StoreSource(store, m, width, chunk))
                  for m in range(members)]
    finally:
        store.close()
        store.remove()
    if program.members:
        return jax.tree.map(lambda *s: jnp.stack(s), *states)
    return states[0]
