"""A client's row as bytes: the leaves of its pytree (in their stored dtypes) side by side.

A store keeps every client's row as one fixed-size byte string, so host memory is one
[members, clients, row_bytes] array and a disk file is one row; `RowLayout` packs a block of
rows [b, ...] (a pytree of NumPy arrays) into [b, row_bytes] and back, without copying a
leaf more than once.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np


class RowLayout(NamedTuple):
    treedef: Any
    shapes: tuple[tuple[int, ...], ...]  # each leaf's shape in one row
    dtypes: tuple[np.dtype, ...]
    offsets: tuple[int, ...]  # byte offset of each leaf in a row
    row_bytes: int

    @classmethod
    def of(cls, row) -> RowLayout:
        """The layout of `row` (one client's pytree of arrays, or of ShapeDtypeStructs)."""
        leaves, treedef = jax.tree.flatten(row)
        shapes = tuple(tuple(leaf.shape) for leaf in leaves)
        dtypes = tuple(np.dtype(leaf.dtype) for leaf in leaves)
        sizes = [int(np.prod(s, dtype=np.int64)) * d.itemsize for s, d in zip(shapes, dtypes)]
        offsets = tuple(int(o) for o in np.cumsum([0] + sizes[:-1]))
        return cls(treedef, shapes, dtypes, offsets, int(sum(sizes)))

    def pack(self, rows) -> np.ndarray:
        """[b, row_bytes] uint8 of a block of rows (a pytree of [b, ...] arrays)."""
        leaves = jax.tree.leaves(rows)
        count = leaves[0].shape[0]
        out = np.empty((count, self.row_bytes), np.uint8)
        for leaf, dtype, offset in zip(leaves, self.dtypes, self.offsets):
            flat = np.ascontiguousarray(leaf, dtype=dtype).reshape(count, -1).view(np.uint8)
            out[:, offset:offset + flat.shape[1]] = flat
        return out

    def unpack(self, packed: np.ndarray):
        """The block of rows (a pytree of [b, ...] NumPy arrays) in `packed` [b, row_bytes]."""
        count = packed.shape[0]
        leaves = []
        for shape, dtype, offset in zip(self.shapes, self.dtypes, self.offsets):
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            part = np.ascontiguousarray(packed[:, offset:offset + size])
            leaves.append(part.view(dtype).reshape((count,) + shape))
        return jax.tree.unflatten(self.treedef, leaves)

    def floats(self) -> int:
        """Numbers in one row (all leaves)."""
        return int(sum(np.prod(s, dtype=np.int64) for s in self.shapes))

    def unpack_device(self, packed: jax.Array):
        """`unpack` inside a jitted program: [..., row_bytes] uint8 to the rows' pytree
        [..., *shape] (bitcasts, no host copy)."""
        lead = packed.shape[:-1]
        leaves = []
        for shape, dtype, offset in zip(self.shapes, self.dtypes, self.offsets):
            count = int(np.prod(shape, dtype=np.int64))
            part = packed[..., offset:offset + count * dtype.itemsize]
            if dtype.itemsize > 1:
                part = part.reshape(lead + (count, dtype.itemsize))
            leaves.append(jax.lax.bitcast_convert_type(part, dtype).reshape(lead + shape))
        return jax.tree.unflatten(self.treedef, leaves)

    def pack_device(self, rows) -> jax.Array:
        """`pack` inside a jitted program: the rows' pytree [..., *shape] to [..., row_bytes]
        uint8, the bytes `pack` gives on the host."""
        parts = []
        for leaf, shape, dtype in zip(jax.tree.leaves(rows), self.shapes, self.dtypes):
            lead = leaf.shape[:leaf.ndim - len(shape)]
            flat = leaf.astype(dtype).reshape(lead + (-1,))
            part = jax.lax.bitcast_convert_type(flat, np.uint8)
            parts.append(part.reshape(lead + (-1,)))
        return jax.numpy.concatenate(parts, axis=-1)
