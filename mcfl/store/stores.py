"""Where the clients' rows live between rounds: host memory or disk (`mcfl.store.files`).

Both stores keep [members, clients] rows of `RowLayout.row_bytes` bytes and answer the same
calls: `gather` the rows of a round's clients, `scatter` the trained ones back, read a `chunk`
of consecutive clients (population-wide steps: evaluation, k-means), and take part in
checkpoints (`manifest` before one is saved, `checkpointed` after, `restore` on resume). A row
no round has written yet is *fresh*: the store says so (`written` false) and the caller makes
it from the algorithm's initial state, so a store of a million clients starts empty.

* `HostStore`: one [M, C, row_bytes] array in memory (pages untouched stay unallocated); with
  a folder, a checkpoint writes only the rows changed since the last one, as files.
* `DiskStore`: every row a file (`GenerationFiles`); host memory holds only the rows in
  flight.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from mcfl.store.files import GenerationFiles, aligned_empty, aligned_zeros


class HostStore:
    kind = "host"

    def __init__(self, members: int, clients: int, row_bytes: int,
                 folder: Optional[Path] = None):
        self.members, self.clients, self.row_bytes = members, clients, row_bytes
        self.rows = np.zeros((members, clients, row_bytes), np.uint8)
        self.written = np.zeros((members, clients), bool)
        self.dirty = np.zeros((members, clients), bool)  # changed since the last checkpoint
        self.files = (GenerationFiles(folder, members, clients, row_bytes)
                      if folder is not None else None)
        self.folder = folder

    def gather(self, member_clients: np.ndarray, skip: Optional[np.ndarray] = None):
        """([M, S, row_bytes] rows, [M, S] written) of each member's clients."""
        out = aligned_empty(member_clients.shape + (self.row_bytes,))
        for member in range(self.members):
            np.take(self.rows[member], member_clients[member], axis=0, out=out[member])
        return out, self.written[np.arange(self.members)[:, None], member_clients]

    def scatter(self, member_clients: np.ndarray, packed: np.ndarray, generation: int) -> None:
        members = np.arange(self.members)[:, None]
        self.rows[members, member_clients] = packed
        self.written[members, member_clients] = True
        self.dirty[members, member_clients] = True

    def chunk(self, member: int, lo: int, hi: int):
        out = aligned_empty((hi - lo, self.row_bytes))
        out[...] = self.rows[member, lo:hi]
        return out, self.written[member, lo:hi]

    def manifest(self, generation: int) -> np.ndarray:
        """Before a checkpoint of round `generation`: the changed rows are written to files;
        the manifest naming every row."""
        for member in range(self.members):
            changed = np.nonzero(self.dirty[member])[0]
            if changed.size:
                self.files.write(member, changed, self.rows[member, changed], generation)
        self.dirty[:] = False
        return self.files.current.copy()

    def checkpointed(self, manifest: np.ndarray) -> None:
        self.files.checkpointed(manifest)

    def restore(self, manifest: np.ndarray) -> None:
        self.files.restore(manifest)
        self.written = manifest > 0
        self.dirty[:] = False
        for member in range(self.members):
            clients = np.nonzero(self.written[member])[0]
            for lo in range(0, clients.size, 1024):
                part = clients[lo:lo + 1024]
                self.rows[member, part] = self.files.read(member, part)

    def close(self) -> None:
        self.rows = np.zeros((0, 0, self.row_bytes), np.uint8)

    def remove(self) -> None:
        self.close()
        if self.files is not None:
            self.files.remove()

    def move_to(self, folder: Path) -> None:
        if self.files is not None:
            self.files.folder = folder


class DiskStore:
    kind = "disk"

    def __init__(self, members: int, clients: int, row_bytes: int, folder: Path):
        self.members, self.clients, self.row_bytes = members, clients, row_bytes
        self.files = GenerationFiles(folder, members, clients, row_bytes)
        self.folder = folder

    @property
    def written(self) -> np.ndarray:
        return self.files.current > 0

    def gather(self, member_clients: np.ndarray, skip: Optional[np.ndarray] = None):
        """([M, S, row_bytes] rows, [M, S] written) of each member's clients; rows where
        `skip` [M, S] is true are not read (their caller has them)."""
        out = aligned_zeros(member_clients.shape + (self.row_bytes,))
        written = self.files.current[np.arange(self.members)[:, None], member_clients] > 0
        for member in range(self.members):
            read = written[member] if skip is None else written[member] & ~skip[member]
            positions = np.nonzero(read)[0]
            self.files.read(member, member_clients[member, positions], out[member], positions)
        return out, written

    def scatter(self, member_clients: np.ndarray, packed: np.ndarray, generation: int) -> None:
        for member in range(self.members):
            self.files.write(member, member_clients[member], packed[member], generation)

    def chunk(self, member: int, lo: int, hi: int):
        written = self.files.current[member, lo:hi] > 0
        out = aligned_zeros((hi - lo, self.row_bytes))
        positions = np.nonzero(written)[0]
        self.files.read(member, lo + positions, out, positions)
        return out, written

    def manifest(self, generation: int) -> np.ndarray:
        return self.files.current.copy()

    def checkpointed(self, manifest: np.ndarray) -> None:
        self.files.checkpointed(manifest)

    def restore(self, manifest: np.ndarray) -> None:
        self.files.restore(manifest)

    def close(self) -> None:
        pass

    def remove(self) -> None:
        self.files.remove()

    def move_to(self, folder: Path) -> None:
        self.files.folder = folder


def make_store(kind: str, members: int, clients: int, row_bytes: int,
               folder: Optional[Path]):
    """A `kind` ("host" or "disk") store of [members, clients] rows of `row_bytes` bytes."""
    if kind == "host":
        return HostStore(members, clients, row_bytes, folder)
    return DiskStore(members, clients, row_bytes, folder)
