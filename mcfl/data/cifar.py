"""CIFAR-10 and CIFAR-100 (Krizhevsky, 2009, "Learning Multiple Layers of Features from Tiny
Images") from their official binary version (https://www.cs.toronto.edu/~kriz/cifar.html,
"Binary version"; files cifar-10-binary.tar.gz and cifar-100-binary.tar.gz).

- ``cifar10``: ``cifar-10-batches-bin/data_batch_1.bin`` .. ``data_batch_5.bin`` (train) and
  ``test_batch.bin``; each record is 1 label byte (0-9) then 3,072 pixel bytes.
- ``cifar100``: ``cifar-100-binary/train.bin`` and ``test.bin``; each record is a coarse label
  byte (0-19), a fine label byte (0-99), then 3,072 pixel bytes. mcfl uses the fine label (100
  classes); the coarse byte is only checked to be in range.

The 3,072 pixel bytes are the red, then green, then blue channel, each 32x32 in row-major
order; mcfl returns them as uint8 [N, 32, 32, 3] (height, width, channel), like the other
image datasets. `--data-dir` may name the extracted folder itself or the folder holding it.
The Python (pickle) version of the same page is refused: unpickling runs code from the file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import numpy as np

from mcfl.data.arrays import LabelledArrays, pooled
from mcfl.errors import DataError

URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
SIDE, CHANNELS = 32, 3
PIXELS = SIDE * SIDE * CHANNELS  # 3,072 bytes per image


@dataclasses.dataclass(frozen=True)
class CifarLayout:
    """Where and how one CIFAR binary version stores its records."""

    name: str
    folder: str  # the folder its archive extracts to
    archive: str
    train: tuple[str, ...]
    test: tuple[str, ...]
    label_classes: tuple[int, ...]  # the classes of each label byte; the last is used
    pickle_folder: str  # the Python version's folder, and a file only it has
    pickle_file: str

    @property
    def record(self) -> int:
        return len(self.label_classes) + PIXELS


LAYOUTS = {
    "cifar10": CifarLayout(
        "cifar10", "cifar-10-batches-bin", "cifar-10-binary.tar.gz",
        tuple(f"data_batch_{i}.bin" for i in range(1, 6)), ("test_batch.bin",), (10,),
        "cifar-10-batches-py", "data_batch_1"),
    "cifar100": CifarLayout(
        "cifar100", "cifar-100-binary", "cifar-100-binary.tar.gz", ("train.bin",),
        ("test.bin",), (20, 100), "cifar-100-python", "train"),
}


def load_cifar(dataset: str, data_dir: Optional[str]) -> LabelledArrays:
    """CIFAR-10 or CIFAR-100 (`dataset`: cifar10 | cifar100), official train then test rows."""
    layout = LAYOUTS[dataset]
    folder = find_folder(layout, data_dir)
    train = _read_files(layout, [folder / name for name in layout.train])
    test = _read_files(layout, [folder / name for name in layout.test])
    return pooled(layout.name, train, test, layout.label_classes[-1])


def find_folder(layout: CifarLayout, data_dir: Optional[str]) -> Path:
    """The folder holding the binary files: `data_dir` itself, else its `layout.folder`."""
    hint = f"download the binary version ({layout.archive}) from {URL} and extract it there"
    if data_dir is None:
        raise DataError(f"{layout.name} needs --data-dir DIR holding {layout.folder}/; {hint}")
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"data directory {str(root)!r} for {layout.name} does not exist; {hint}")
    names = layout.train + layout.test
    inner = root / layout.folder
    folder = inner if inner.is_dir() and not (root / names[0]).is_file() else root
    missing = [name for name in names if not (folder / name).is_file()]
    if missing and _is_pickle_version(layout, root):
        raise DataError(f"{root} holds the Python (pickle) version of {layout.name}, which mcfl "
                        f"does not read (unpickling runs code from the file); {hint}, or use "
                        f"--dataset tfds:{layout.name}")
    if missing:
        raise DataError(f"{folder} has no {', '.join(missing)}: --data-dir must name "
                        f"{layout.folder}/ of the binary version or the folder holding it; {hint}")
    return folder


def _is_pickle_version(layout: CifarLayout, root: Path) -> bool:
    """Whether `root` is or holds the Python version (its folder, or a file only it has)."""
    return (root.name == layout.pickle_folder or (root / layout.pickle_folder).is_dir()
            or (root / layout.pickle_file).is_file())


def _read_files(layout: CifarLayout, paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 32, 32, 3], labels int64 [N]) of the files, in order."""
    parts = [read_records(layout, path) for path in paths]
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


def read_records(layout: CifarLayout, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One binary file's images (HWC) and used labels, every label byte checked in range."""
    size = path.stat().st_size
    labels = len(layout.label_classes)
    if size == 0 or size % layout.record:
        label_bytes = "1 label byte" if labels == 1 else f"{labels} label bytes"
        raise DataError(f"{path} has {size} bytes, not a positive multiple of {layout.name}'s "
                        f"{layout.record}-byte record ({label_bytes} + {PIXELS} pixels); is it "
                        "truncated or another file?")
    try:
        records = np.fromfile(path, np.uint8).reshape(-1, layout.record)
    except OSError as err:
        raise DataError(f"{path} cannot be read: {err.strerror or err}") from None
    for column, classes in enumerate(layout.label_classes):
        bad = np.flatnonzero(records[:, column] >= classes)
        if bad.size:
            row = int(bad[0])
            raise DataError(f"{path}: record {row} has label {records[row, column]} in byte "
                            f"{column}, but {layout.name}'s labels there are 0 to {classes - 1}"
                            "; is it the binary version of this dataset?")
    images = records[:, labels:].reshape(-1, CHANNELS, SIDE, SIDE).transpose(0, 2, 3, 1)
    return images, records[:, labels - 1].astype(np.int64)
