"""Reading IDX files (the MNIST / Fashion-MNIST format), gzipped or not, with checks.

Format: two zero bytes, a type code (0x08 = unsigned byte), the number of dimensions, each
dimension as a big-endian uint32, then the data in C order.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from mcfl.errors import DataError

_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """The array stored in an IDX file; a malformed or truncated file is a DataError naming it."""
    path = Path(path)
    try:
        raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read IDX file {path}: {e}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _TYPES:
        raise DataError(f"{path} is not an IDX file (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} is truncated: its header needs {header} bytes, found {len(raw)}")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_TYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(
            f"{path} is truncated or padded: shape {shape} needs {expected} bytes of data, "
            f"found {len(raw) - header}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))  # native byte order


def find_idx(data_dir: Path, stem: str) -> Path:
    """`stem` (e.g. 'train-images-idx3-ubyte') in `data_dir`, gzipped or not."""
    for name in (stem + ".gz", stem):
        if (data_dir / name).is_file():
            return data_dir / name
    raise DataError(f"{data_dir} has no {stem}.gz (or {stem})")


def load_idx_dataset(data_dir: Path) -> tuple[tuple[np.ndarray, np.ndarray], tuple]:
    """The official (images, labels) train and test splits of an MNIST-layout folder."""
    splits = []
    for prefix in ("train", "t10k"):
        images = read_idx(find_idx(data_dir, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(find_idx(data_dir, f"{prefix}-labels-idx1-ubyte"))
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataError(
                f"{data_dir}: {prefix} images {images.shape} and labels {labels.shape} "
                "do not match (expected [N, H, W] and [N])"
            )
        splits.append((images, labels.astype(np.int64)))
    return splits[0], splits[1]
