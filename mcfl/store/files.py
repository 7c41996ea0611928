"""Client rows on disk, one file per (member, client, generation), and the manifest naming
the current generation of each.

A row is never written over: round r writes client i's row as a new file ``i_r.row``, and the
manifest (an [M, C] int32 array in memory, 0: the client never trained, its row is fresh)
points at it. A checkpoint saves the manifest (4 bytes a client, in the checkpoint itself), so
a checkpoint costs nothing in proportion to the population: the rows it needs are the files
its manifest names, which stay until a later checkpoint no longer names them. A kill at any
moment leaves files no saved manifest names; `restore` deletes them. A row written to a file
that cannot be written (a full disk, a folder turned read-only) raises `WriteError` in one
line; the manifest keeps naming the rows before it.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

import numpy as np

from mcfl.files import faults
from mcfl.files.atomic import WriteError

SUFFIX = ".row"
SHARD = 4096  # clients a sub-folder holds, so that no folder has a million entries


class GenerationFiles:
    """The row files of a store in `folder`, for `members` x `clients` rows of `row_bytes`."""

    def __init__(self, folder: Path, members: int, clients: int, row_bytes: int):
        self.folder = Path(folder)
        self.row_bytes = row_bytes
        self.current = np.zeros((members, clients), np.int32)  # the generation of each row
        self.saved = self.current.copy()  # the manifest of the last checkpoint

    def _path(self, member: int, client: int, generation: int) -> Path:
        return (self.folder / str(member) / str(client // SHARD)
                / f"{client}_{generation}{SUFFIX}")

    def write(self, member: int, clients: np.ndarray, packed: np.ndarray,
              generation: int) -> None:
        """Write the rows `packed` [n, row_bytes] of `clients` as `generation`; the rows they
        replace are deleted unless the last checkpoint names them."""
        for client, row in zip(clients.tolist(), packed):
            faults.point("store_write")
            path = self._path(member, client, generation)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "wb") as f:
                    f.write(row.data)
            except OSError as e:
                with contextlib.suppress(OSError):
                    path.unlink()
                raise WriteError(path, e) from None
            old = int(self.current[member, client])
            self.current[member, client] = generation
            if old not in (0, generation, int(self.saved[member, client])):
                with contextlib.suppress(OSError):
                    self._path(member, client, old).unlink()

    def read(self, member: int, clients: np.ndarray, out: Optional[np.ndarray] = None,
             positions: Optional[np.ndarray] = None) -> np.ndarray:
        """The rows of `clients` (all written: generation > 0) read into rows `positions`
        (default 0, 1, ...) of `out` (default: a new [n, row_bytes] `aligned_empty`)."""
        clients = np.asarray(clients).tolist()
        if out is None:
            out = aligned_empty((len(clients), self.row_bytes))
        positions = range(len(clients)) if positions is None else np.asarray(positions).tolist()
        for j, client in zip(positions, clients):
            path = self._path(member, client, int(self.current[member, client]))
            with open(path, "rb") as f:
                if f.readinto(memoryview(out[j])) != self.row_bytes:
                    raise OSError(f"{str(path)!r} is shorter than a row "
                                  f"({self.row_bytes} bytes)")
        return out

    def checkpointed(self, manifest: np.ndarray) -> None:
        """A checkpoint naming `manifest` is saved: the rows only the previous one named, and
        that the current rows replaced, are deleted."""
        stale = (self.saved != manifest) & (self.saved > 0) & (self.saved != self.current)
        for member, client in zip(*np.nonzero(stale)):
            with contextlib.suppress(OSError):
                self._path(int(member), int(client), int(self.saved[member, client])).unlink()
        self.saved = manifest.copy()

    def restore(self, manifest: np.ndarray) -> None:
        """Continue from a checkpoint's `manifest`: files it does not name (written after it,
        before a stop) are deleted."""
        self.current = manifest.astype(np.int32).copy()
        self.saved = self.current.copy()
        for member_folder in _folders(self.folder):
            member = int(member_folder.name)
            for shard in _folders(member_folder):
                for path in shard.iterdir():
                    name = path.name.removesuffix(SUFFIX)
                    client, _, generation = name.partition("_")
                    keep = (path.name.endswith(SUFFIX) and client.isdigit()
                            and generation.isdigit() and member < self.current.shape[0]
                            and int(client) < self.current.shape[1]
                            and self.current[member, int(client)] == int(generation))
                    if not keep:
                        with contextlib.suppress(OSError):
                            path.unlink()

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


# JAX's CPU client takes a NumPy array aligned to this many bytes without copying it (0.2 ms
# against 0.17 s for 268 MB of rows, whose copy would cost the device store's round time).
ALIGNMENT = 64


def aligned_empty(shape, dtype=np.uint8) -> np.ndarray:
    """An uninitialised array whose data start on an `ALIGNMENT`-byte boundary."""
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    raw = np.empty(size + ALIGNMENT, np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT
    return raw[start:start + size].view(dtype).reshape(shape)


def aligned_zeros(shape, dtype=np.uint8) -> np.ndarray:
    out = aligned_empty(shape, dtype)
    out[...] = 0
    return out


def _folders(folder: Path) -> Iterable[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
