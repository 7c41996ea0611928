"""A host or disk store's rows as a round program moves them: the protocol between the store
(`mcfl.store.stores`) and the rounds (`mcfl.runs.stored_rounds`).

* `gather(r, clients)`: the [M, S] rows of round `r`'s clients, fetched already when
  `prefetch` asked for them, with the rows the last round trained taken from its result (the
  writer may not have stored them yet);
* `prefetch(r, clients, current)`: read round `r`'s rows on a reader thread while the round
  before computes (the rows of the `current` round's clients are left for `gather` to take
  from that round's result);
* `scatter(clients, packed, r)`: write the trained rows back on a writer thread while the next
  round computes (`wait_writes` waits for them; a failed write raises there);
* `chunks(size)`: every client's row, `size` consecutive clients at a time, the next chunk read
  while the caller works on this one (evaluation);
* a checkpoint's part (`manifest`, `checkpointed`, `restore`), `move_to` and `close`.

Rows travel as bytes ([M, S, row_bytes] uint8, `mcfl.store.layout.RowLayout`): the host only
reads and writes them, the jitted programs unpack and pack them.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import numpy as np


class StoredRows:
    """The traffic of `store`'s rows ([members, clients] of them) to and from the rounds."""

    def __init__(self, store):
        self.store = store
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="mcfl-store")
        self._writing: Optional[concurrent.futures.Future] = None
        self._fetched = None  # (round, clients [M, S], future of the gather)
        self._last = None  # (clients [M, S], packed rows [M, S, B]) of the last round

    @property
    def members(self) -> int:
        return self.store.members

    def gather(self, r: int, clients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([M, S, B] rows, [M, S] written) of round `r`'s `clients` [M, S]."""
        fetched, self._fetched = self._fetched, None
        if fetched is not None and fetched[0] == r and np.array_equal(fetched[1], clients):
            packed, written = fetched[2].result()
        else:
            self.wait_writes()
            packed, written = self.store.gather(clients)
        if self._last is not None:  # rows the last round trained: from its result
            last_clients, last_packed = self._last
            for m in range(clients.shape[0]):
                where = {int(c): j for j, c in enumerate(last_clients[m])}
                for j, c in enumerate(clients[m].tolist()):
                    if c in where:
                        packed[m, j] = last_packed[m, where[c]]
                        written[m, j] = True
        return packed, written

    def prefetch(self, r: int, clients: np.ndarray, current: np.ndarray) -> None:
        """Start reading round `r`'s `clients` [M, S]; those among the `current` round's
        clients are not read (`gather` takes them from that round's result)."""
        skip = np.stack([np.isin(u, c) for u, c in zip(clients, current)])
        self._fetched = (r, clients, self._pool.submit(self.store.gather, clients, skip))

    def scatter(self, clients: np.ndarray, packed: np.ndarray, r: int) -> None:
        """Write round `r`'s trained rows [M, S, B] of `clients` [M, S], on the writer."""
        self.wait_writes()  # (one write in flight: the store's generations stay in order)
        self._last = (clients, packed)
        self._writing = self._pool.submit(self.store.scatter, clients, packed, r)

    def wait_writes(self) -> None:
        """Wait for the rows being written (a failed write raises here)."""
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    def chunks(self, size: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(first client, [M, size, B] rows, [M, size] written) of every chunk of `size`
        consecutive clients, the next read while the caller evaluates this one (past the last
        client: the last client again, as the device store pads)."""
        self.wait_writes()
        clients = self.store.clients
        reading = self._pool.submit(self._read_chunk, 0, size)
        for lo in range(0, clients, size):
            packed, written = reading.result()
            if lo + size < clients:
                reading = self._pool.submit(self._read_chunk, lo + size, size)
            yield lo, packed, written

    def _read_chunk(self, lo: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        hi = min(lo + size, self.store.clients)
        rows, written = zip(*(self.store.chunk(m, lo, hi) for m in range(self.members)))
        # (one member's rows as read: aligned, so the device takes them without a copy)
        rows = rows[0][None] if len(rows) == 1 else np.stack(rows)
        written = np.stack(written)
        if hi - lo < size:
            pad = size - (hi - lo)
            rows = np.concatenate([rows, np.repeat(rows[:, -1:], pad, axis=1)], axis=1)
            written = np.concatenate([written, np.repeat(written[:, -1:], pad, axis=1)],
                                     axis=1)
        return rows, written

    # ---- checkpoints
    def manifest(self, r: int) -> np.ndarray:
        """What a checkpoint of round `r` keeps of the store: its manifest of rows."""
        self.wait_writes()
        return self.store.manifest(r)

    def checkpointed(self, manifest: np.ndarray) -> None:
        self.store.checkpointed(manifest)

    def manifest_template(self) -> np.ndarray:
        return np.zeros((self.members, self.store.clients), np.int32)

    def restore(self, manifest: np.ndarray) -> None:
        self.store.restore(np.asarray(manifest))
        self._fetched = self._last = None

    def move_to(self, folder: Path) -> None:
        """The run folder moved (a replaced run swapped in): the store is now in `folder`."""
        self.wait_writes()
        self.store.move_to(folder)

    def close(self) -> None:
        """Wait for the writes in flight and let the store go (a run folder's stays: its
        checkpoints name its rows)."""
        try:
            self.wait_writes()
        finally:
            self.store.close()
