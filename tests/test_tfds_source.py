"""TFDS loader on tfds's offline mock data: splits pooled in order, labels, resizing, errors."""

import re
import sys

import numpy as np
import pytest
from PIL import Image

from mcfl.data import tfds_source
from mcfl.data.tfds_source import TFDS_DATASETS, load_tfds
from mcfl.errors import DataError

tfds = pytest.importorskip("tensorflow_datasets")

N = 6  # mock examples per split


@pytest.mark.parametrize(
    "name, shape, num_classes",
    [
        ("mnist", (28, 28, 1), 10),
        ("fashion_mnist", (28, 28, 1), 10),
        ("emnist/letters", (28, 28, 1), 37),
        ("cifar10", (32, 32, 3), 10),
    ],
)
def test_labelled_datasets_pool_train_then_test(name, shape, num_classes):
    with tfds.testing.mock_data(num_examples=N):
        data = load_tfds(name)
        train, test = tfds.data_source(name, split=["train", "test"], download=False)
        examples = [train[i] for i in range(N)] + [test[i] for i in range(N)]
    assert data.name == name and data.num_classes == num_classes
    assert data.x.shape == (2 * N, *shape) and data.x.dtype == np.uint8
    assert data.y.dtype == np.int64 and 0 <= data.y.min() and data.y.max() < num_classes
    np.testing.assert_array_equal(data.official_train, np.arange(2 * N) < N)
    np.testing.assert_array_equal(data.x, np.stack([e["image"] for e in examples]))
    np.testing.assert_array_equal(data.y, [e["label"] for e in examples])


@pytest.mark.parametrize("image_size", [84, 32])
def test_celeb_a_smiling_labels_and_resized_images(image_size):
    with tfds.testing.mock_data(num_examples=N):
        data = load_tfds("celeb_a", image_size=image_size)
        splits = tfds.data_source("celeb_a", split=["train", "validation", "test"], download=False)
        examples = [split[i] for split in splits for i in range(N)]
    assert data.x.shape == (3 * N, image_size, image_size, 3) and data.x.dtype == np.uint8
    assert data.num_classes == 2 and set(data.y.tolist()) <= {0, 1}
    np.testing.assert_array_equal(data.y, [int(e["attributes"]["Smiling"]) for e in examples])
    np.testing.assert_array_equal(data.official_train, np.arange(3 * N) < N)
    first = Image.fromarray(examples[0]["image"]).resize(
        (image_size, image_size), Image.Resampling.BILINEAR
    )
    np.testing.assert_array_equal(data.x[0], np.asarray(first))


class _CountingSource:
    """A data source wrapper whose batched reads work, recording how it was read."""

    def __init__(self, source, calls):
        self._source, self._calls = source, calls
        self.dataset_info = source.dataset_info

    def __len__(self):
        return len(self._source)

    def __getitem__(self, index):
        self._calls.append(1)
        return self._source[index]

    def __getitems__(self, indices):
        self._calls.append(len(indices))
        return [self._source[i] for i in indices]


def test_examples_are_read_in_batches(monkeypatch):
    calls: list[int] = []
    real = tfds.data_source

    def counting(*args, **kwargs):
        return [_CountingSource(source, calls) for source in real(*args, **kwargs)]

    monkeypatch.setattr(tfds, "data_source", counting)
    monkeypatch.setattr(tfds_source, "_BATCH", 8)
    with tfds.testing.mock_data(num_examples=20):
        data = load_tfds("mnist")
    assert len(data) == 40
    assert calls == [8, 8, 4, 8, 8, 4]  # per split: full batches, then the rest


def test_missing_directory_names_it_and_the_build_command(tmp_path):
    for data_dir in (tmp_path, tmp_path / "absent"):
        with pytest.raises(DataError) as raised:
            load_tfds("mnist", data_dir=str(data_dir), download=False)
        message = str(raised.value)
        assert str(data_dir) in message
        assert f"tfds build mnist --data_dir {data_dir}" in message and "--download" in message
    assert list(tmp_path.iterdir()) == []  # nothing was downloaded or created


def test_unknown_dataset_lists_the_allowed_ones():
    allowed = ", ".join(TFDS_DATASETS)
    with pytest.raises(DataError, match=re.escape(f"'imagenet2012'; allowed: {allowed}")):
        load_tfds("imagenet2012")


def test_missing_tensorflow_datasets_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # makes the import fail
    with pytest.raises(DataError, match=re.escape("pip install 'mcfl[tfds]'")):
        load_tfds("mnist")
