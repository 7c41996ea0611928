"""A population start through a client store: every client trains once, in chunks, its
features go to the store, and the clustering reads them back chunk by chunk.

FeSEM's and Robust's initialisation (`base.PopulationStart`) needs every client's trained
model at once: [C, d] floats, 48 GB for 60,000 clients of a 199,210-parameter MLP. Here the
clients train `START_CHUNK_BYTES` worth at a time, the features are written to a store of the
run's kind (host memory or disk, `start/` in the store folder), and the algorithm's `finish`
clusters them as a `StoreSource` (`mcfl.clustering.streamed.RowSource`). The features are
deleted once the state is made. With ``--client-store-dtype bfloat16`` they are stored as
bfloat16 (half the disk; the clustering reads them back as float32, rounded).

The clustering equals the in-memory one (`mcfl.clustering.streamed`: the same seeds, the same
iterations) up to rounding, which only decides between clusterings of exactly equal cost (one
outlier trimmed or alone in a cluster, the other way round): there the chunked sums and the
in-memory ones may choose differently.
"""

from __future__ import annotations

import concurrent.futures

import jax
import jax.numpy as jnp
import numpy as np

from mcfl.algorithms.framework.device import DeviceState
from mcfl.algorithms.framework.stored import to_storage
from mcfl.store.stores import make_store
from mcfl.transforms import initial_state

# Features of the clients trained together, at most (float32).
START_CHUNK_BYTES = 1 << 28


class StoreSource:
    """One member's rows of a store of feature rows (stored as `dtype`: float32, or bfloat16
    with ``--client-store-dtype bfloat16``), as a float32 `RowSource`."""

    def __init__(self, store, member: int, dim: int, chunk: int, dtype=np.float32):
        self.store, self.member, self.dim, self.chunk = store, member, dim, chunk
        # (bfloat16 travels as its uint16 bits: `stored.to_storage`)
        self.dtype = np.dtype(jnp.bfloat16) if np.dtype(dtype) == np.uint16 else np.dtype(dtype)
        self.num_rows = store.clients

    def _floats(self, packed: np.ndarray) -> np.ndarray:
        return packed.view(self.dtype).reshape(len(packed), self.dim).astype(np.float32,
                                                                              copy=False)

    def _read(self, lo: int) -> np.ndarray:
        rows, _ = self.store.chunk(self.member, lo, min(lo + self.chunk, self.num_rows))
        return self._floats(rows)

    def chunks(self):
        """The rows chunk by chunk, the next one read (a thread) while the caller works on
        this one: a pass over a disk store reads while it computes."""
        with concurrent.futures.ThreadPoolExecutor(1) as reader:
            reading = reader.submit(self._read, 0)
            for lo in range(0, self.num_rows, self.chunk):
                rows = reading.result()
                if lo + self.chunk < self.num_rows:
                    reading = reader.submit(self._read, lo + self.chunk)
                yield lo, rows

    def rows(self, index: np.ndarray) -> np.ndarray:
        index = np.asarray(index, np.int64)
        members = np.full((self.store.members, index.size), 0, np.int64)
        members[self.member] = index
        packed, _ = self.store.gather(members)
        return self._floats(packed[self.member])

    def columns(self, lo: int, hi: int) -> np.ndarray:
        return np.concatenate([rows[:, lo:hi] for _, rows in self.chunks()], axis=0)


def streamed_start(program, values, init_keys, data, members: int):
    """The initial state of `program`'s algorithm (its `PopulationStart`) for each member,
    with the clients' features in a `program.kind` store, as the run's `DeviceState`; stacked
    [M] when `program.members`."""
    client_state = program.algorithm.client_state
    start = client_state.start
    num_clients = int(data.num_clients)
    keys = init_keys if program.members else init_keys[None]

    def member_values(m):
        return {k: v[m] for k, v in values.items()}

    def points(values_m, key, data, clients):  # (in the store's dtype)
        return to_storage(start.points(data, key, program.hyperparams(values_m, private=False),
                                       clients), client_state.dtype)

    points_fn = jax.jit(points)
    return _train_and_cluster(program, start, points_fn, member_values, keys, data, members,
                              num_clients)


def _train_and_cluster(program, start, points_fn, member_values, keys, data, members: int,
                       num_clients: int):
    shape = jax.eval_shape(points_fn, member_values(0), keys[0], data,
                           jax.ShapeDtypeStruct((1,), jnp.int32))
    width, dtype = shape.shape[1], np.dtype(shape.dtype)
    chunk = max(1, min(num_clients, START_CHUNK_BYTES // (4 * width)))
    folder = None if program.folder is None else program.folder / "start"
    store = make_store(program.kind, members, num_clients, dtype.itemsize * width, folder)
    try:
        for lo in range(0, num_clients, chunk):
            clients = np.minimum(np.arange(lo, lo + chunk), num_clients - 1)
            rows = np.stack([np.asarray(jax.device_get(points_fn(
                member_values(m), keys[m], data, jnp.asarray(clients, jnp.int32))))
                for m in range(members)])
            kept = min(chunk, num_clients - lo)
            store.scatter(np.broadcast_to(clients[:kept], (members, kept)).copy(),
                          rows[:, :kept].view(np.uint8), 1)
        params = [program.hyperparams(member_values(m)) for m in range(members)]
        states = [DeviceState(start.finish(data, keys[m], params[m],
                                           StoreSource(store, m, width, chunk, dtype)),
                              None, initial_state(program.transform, params[m].privacy))
                  for m in range(members)]
    finally:
        store.close()
        store.remove()
    if program.members:
        return jax.tree.map(lambda *s: jnp.stack(s), *states)
    return states[0]
