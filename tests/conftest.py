"""Shared fixtures: tiny federated datasets built once per session."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from mcfl.data.federated import from_splits

# The CLI caches prepared datasets by default: keep the tests' cache out of the home folder.
os.environ["MCFL_CACHE_DIR"] = tempfile.mkdtemp(prefix="mcfl-test-cache-")


def ragged_dataset(sizes, num_features=5, num_classes=3, seed=0, name="ragged"):
    """A dataset whose client i has exactly sizes[i] training rows and 2 test rows."""
    rng = np.random.default_rng(seed)
    sizes = np.asarray(sizes)
    owner = np.repeat(np.arange(len(sizes)), sizes)
    x = rng.normal(size=(owner.size, num_features)).astype(np.float32)
    y = rng.integers(0, num_classes, owner.size)
    test_owner = np.repeat(np.arange(len(sizes)), 2)
    xt = rng.normal(size=(test_owner.size, num_features)).astype(np.float32)
    yt = rng.integers(0, num_classes, test_owner.size)
    return from_splits(name, (x, y, owner), (xt, yt, test_owner), len(sizes), num_classes)


@pytest.fixture(scope="session")
def ragged():
    """Six clients with very different sizes (3 to 300 training rows)."""
    return ragged_dataset([3, 300, 17, 40, 9, 64])
