"""Image datasets from TensorFlow Datasets, read through random-access array_record files.

``tfds.data_source`` needs neither TensorFlow nor a network once a dataset is prepared in the
array_record format; tensorflow-datasets itself is an optional dependency (``mcfl[tfds]``).
The official splits are pooled (train first) into one `LabelledArrays`; mcfl re-splits them per
client.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from PIL import Image

from mcfl.data.arrays import LabelledArrays
from mcfl.errors import DataError

TFDS_DATASETS = ("mnist", "fashion_mnist", "emnist", "cifar10", "cifar100", "celeb_a")

_BATCH = 1024  # examples per read: few Python calls, bounded memory per batch
_SPLITS = {"celeb_a": ("train", "validation", "test")}
_DEFAULT_SPLITS = ("train", "test")


def load_tfds(
    name: str, data_dir: str | None = None, download: bool = False, image_size: int = 84
) -> LabelledArrays:
    """All official splits of a TFDS dataset, pooled: uint8 images [N, H, W, C] and int labels.

    `name` may name a builder config ("emnist/letters"). Labels are the ``label`` feature (for
    cifar100 the fine label, 100 classes, not ``coarse_label``), except for celeb_a whose label
    is whether the person smiles (0/1) and whose images are resized to `image_size` squared.
    Nothing is downloaded unless `download` is true.
    """
    base = _base_name(name)
    tfds = _import_tfds()
    if data_dir is not None and not download and not os.path.isdir(data_dir):
        raise _not_prepared(tfds, name, data_dir, "the directory does not exist")
    splits = _SPLITS.get(base, _DEFAULT_SPLITS)
    sources = _open_sources(tfds, name, splits, data_dir, download)
    resize = image_size if base == "celeb_a" else None
    x, y = _read_all(sources, _label_reader(base), resize)
    official_train = np.arange(len(y)) < len(sources[0])
    num_classes = _num_classes(sources[0], base, y)
    if y.size and y.max() >= num_classes:
        raise DataError(f"{name} has label {y.max()}, but only {num_classes} classes")
    return LabelledArrays(name, x, y, num_classes, official_train)


def _base_name(name: str) -> str:
    """The builder name without config or version ("emnist/letters:3.1.0" -> "emnist")."""
    base = name.split("/")[0].split(":")[0]
    if base not in TFDS_DATASETS:
        raise DataError(
            f"unknown TFDS dataset {name!r}; allowed: {', '.join(TFDS_DATASETS)} "
            "(optionally with a config, e.g. emnist/letters)"
        )
    return base


def _import_tfds() -> Any:
    try:
        import tensorflow_datasets as tfds
    except ImportError as err:
        raise DataError(
            f"TFDS datasets need tensorflow-datasets ({err}); pip install 'mcfl[tfds]'"
        ) from None
    return tfds


def _open_sources(
    tfds: Any, name: str, splits: Sequence[str], data_dir: str | None, download: bool
) -> list[Sequence[Any]]:
    try:
        return list(
            tfds.data_source(name, split=list(splits), data_dir=data_dir, download=download)
        )
    except (NotImplementedError, FileNotFoundError, KeyError) as err:
        # tfds reports an unprepared dataset as an unsupported TFRECORD file format (or, in its
        # default directory, as a missing split), which misleads: say what to run instead.
        reason = "no prepared array_record splits found there"
        raise _not_prepared(tfds, name, data_dir, reason) from err


def _not_prepared(tfds: Any, name: str, data_dir: str | None, reason: str) -> DataError:
    searched = data_dir if data_dir is not None else _default_data_dir(tfds)
    return DataError(
        f"TFDS dataset {name} is not prepared in array_record format in {searched} ({reason}). "
        f"On a machine with internet, run `pip install tensorflow tensorflow-datasets` and "
        f"`tfds build {name} --data_dir {searched} --file_format array_record`, then copy that "
        "directory here; or pass --download to let mcfl download and prepare it"
    )


def _default_data_dir(tfds: Any) -> str:
    """Where tfds looks when no data_dir is given: TFDS_DATA_DIR, else ~/tensorflow_datasets."""
    try:
        return str(tfds.core.constants.DATA_DIR)  # fixed when tfds was imported
    except AttributeError:
        return os.environ.get("TFDS_DATA_DIR", os.path.expanduser("~/tensorflow_datasets"))


def _label_reader(base: str) -> Callable[[dict], Any]:
    if base == "celeb_a":
        return lambda example: example["attributes"]["Smiling"]
    return lambda example: example["label"]


def _read_all(
    sources: Sequence[Sequence[Any]], label_of: Callable[[dict], Any], resize: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Images and labels of all sources, in order, filled into one preallocated array."""
    total = sum(len(source) for source in sources)
    x: np.ndarray | None = None
    y = np.empty(total, np.int64)
    row = 0
    for source in sources:
        for batch in _batches(source):
            images = _images(batch, resize)
            if x is None:
                x = np.empty((total, *images.shape[1:]), np.uint8)
            x[row : row + len(batch)] = images
            y[row : row + len(batch)] = [int(label_of(example)) for example in batch]
            row += len(batch)
    if x is None:
        raise DataError("the TFDS dataset has no examples")
    return x, y


def _batches(source: Sequence[Any]) -> Iterator[list[dict]]:
    for start in range(0, len(source), _BATCH):
        yield _read_batch(source, list(range(start, min(start + _BATCH, len(source)))))


def _read_batch(source: Any, indices: list[int]) -> list[dict]:
    try:
        return list(source.__getitems__(indices))
    except TypeError:
        # tfds.testing.mock_data (tfds 4.9) installs a __getitems__ that cannot be called;
        # indexing returns the same examples (and repeats any genuine error).
        return [source[i] for i in indices]


def _images(batch: list[dict], resize: int | None) -> np.ndarray:
    if resize is None:
        return np.stack([np.asarray(example["image"], np.uint8) for example in batch])
    return np.stack([_resized(example["image"], resize) for example in batch])


def _resized(image: np.ndarray, size: int) -> np.ndarray:
    resized = Image.fromarray(np.asarray(image, np.uint8)).resize(
        (size, size), Image.Resampling.BILINEAR
    )
    return np.asarray(resized, np.uint8)


def _num_classes(source: Any, base: str, y: np.ndarray) -> int:
    """Classes from the builder's metadata when it has them, else the largest label + 1."""
    if base == "celeb_a":
        return 2
    try:
        return int(source.dataset_info.features["label"].num_classes)
    except (AttributeError, KeyError, TypeError):
        return int(y.max()) + 1
