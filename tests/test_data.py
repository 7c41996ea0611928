"""Datasets and partitions: nothing lost or duplicated, recipes as documented, clear errors."""

import numpy as np
import pytest

from mcfl.data import dirichlet, from_owner, generate_synthetic, iid
from mcfl.data.federated import split_train_test
from mcfl.errors import DataError


def test_synthetic_follows_the_fedprox_recipe():
    a = generate_synthetic(30, 1.0, 1.0, seed=3)
    b = generate_synthetic(30, 1.0, 1.0, seed=3)
    np.testing.assert_array_equal(a.arrays.x_train, b.arrays.x_train)  # seeded
    n_train, n_test = a.train_counts(), a.test_counts()
    total = n_train + n_test
    assert total.min() >= 50  # lognormal(4, 2) + 50
    np.testing.assert_array_equal(n_train, np.floor(0.9 * total))  # FedProx 90/10 split
    assert a.arrays.x_train.shape[1:] == (60,) and a.num_classes == 10
    y = np.asarray(a.arrays.y_train)
    assert 0 <= y.min() and y.max() < 10
    # alpha = beta = 0 makes the clients alike: their label distributions agree more.
    c = generate_synthetic(30, 0.0, 0.0, seed=3)
    assert _label_spread(c) < _label_spread(a)
    assert not np.array_equal(
        generate_synthetic(30, 1.0, 1.0, seed=4).arrays.x_train[:5], a.arrays.x_train[:5]
    )


def test_synthetic_rows_do_not_depend_on_the_generation_chunk(monkeypatch):
    """Rows are generated chunk by chunk straight into the train and test arrays on the device:
    chunks of 7 rows (splitting clients across chunks) give the very same dataset."""
    from mcfl.data import synthetic

    whole = generate_synthetic(6, 1.0, 1.0, seed=2)
    monkeypatch.setattr(synthetic, "_CHUNK", 7)
    chunked = generate_synthetic(6, 1.0, 1.0, seed=2)
    for name in ("x_train", "y_train", "x_test", "y_test", "train_counts", "test_counts"):
        np.testing.assert_array_equal(getattr(whole.arrays, name), getattr(chunked.arrays, name))


def test_device_rows_are_filled_chunk_by_chunk():
    from mcfl.data.federated import DeviceRows

    values = np.arange(30, dtype=np.float32).reshape(10, 3)
    rows = DeviceRows((10, 3))
    for start in (0, 4, 8):
        rows.write(start, values[start:start + 4])
    np.testing.assert_array_equal(rows.array, values)


def _label_spread(ds):
    """Mean total-variation distance between client label histograms and the pooled one."""
    y, owner = np.asarray(ds.arrays.y_train), np.asarray(ds.arrays.train_owner)
    hist = np.zeros((ds.num_clients, ds.num_classes))
    np.add.at(hist, (owner, y), 1)
    hist /= hist.sum(1, keepdims=True)
    return np.abs(hist - hist.mean(0)).sum(1).mean() / 2


def test_split_keeps_every_row_once_and_one_test_row_per_client():
    rng = np.random.default_rng(0)
    owner = np.repeat(np.arange(5), [2, 3, 10, 100, 1])
    train, test = split_train_test(owner, 5, 0.2, rng)
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(owner.size))
    np.testing.assert_array_equal(np.bincount(owner[train], minlength=5), [1, 2, 8, 80, 1])
    np.testing.assert_array_equal(np.bincount(owner[test], minlength=5), [1, 1, 2, 20, 0])


def test_iid_deals_near_equal_parts():
    owner = iid(1003, 10, np.random.default_rng(0))
    counts = np.bincount(owner, minlength=10)
    assert counts.sum() == 1003 and counts.max() - counts.min() <= 1


def test_dirichlet_10000_clients_small_alpha_every_client_served():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 60_000)
    owner = dirichlet(labels, 10_000, 0.05, rng)
    counts = np.bincount(owner, minlength=10_000)
    assert owner.shape == labels.shape and counts.sum() == 60_000
    assert counts.min() >= 2  # one train and one test sample at least
    # Small alpha concentrates each client on few classes; large alpha does not.
    skewed = _classes_per_client(labels, dirichlet(labels, 100, 0.05, rng))
    flat = _classes_per_client(labels, dirichlet(labels, 100, 100.0, rng))
    assert skewed < 4 and flat > 9


def _classes_per_client(labels, owner):
    pairs = np.unique(np.stack([owner, labels]), axis=1)
    return np.bincount(pairs[0]).mean()


@pytest.mark.parametrize("alpha", [0.0, -1.0])
def test_dirichlet_rejects_nonpositive_alpha(alpha):
    with pytest.raises(DataError, match=f"alpha must be > 0, got {alpha}"):
        dirichlet(np.zeros(10, int), 2, alpha, np.random.default_rng(0))


def test_more_clients_than_samples_is_an_error():
    with pytest.raises(DataError, match="100 clients need at least 200 samples.*has 50"):
        dirichlet(np.zeros(50, int), 100, 0.5, np.random.default_rng(0))
    with pytest.raises(DataError, match="has 5"):
        iid(5, 10, np.random.default_rng(0))


def test_client_without_data_is_named():
    x, y = np.zeros((4, 2), np.float32), np.zeros(4, int)
    with pytest.raises(DataError, match=r"1 client\(s\) have no data \(first: \[2\]\)"):
        from_owner("t", x, y, np.array([0, 0, 1, 1]), 3, 2, 0.5, np.random.default_rng(0))


def test_stratified_split_keeps_classes_in_train_and_the_test_share():
    rng = np.random.default_rng(0)
    owner = np.repeat(np.arange(100), 18)  # tiny clients: 18 rows over 10 classes
    labels = rng.integers(0, 10, owner.size)
    train, test = split_train_test(owner, 100, 0.2, rng, labels=labels)
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(owner.size))
    assert 0.15 < test.size / owner.size < 0.25
    held = {(o, y) for o, y in zip(owner, labels)}
    assert {(o, y) for o, y in zip(owner[train], labels[train])} == held  # no class lost
    assert (np.bincount(owner[test], minlength=100) >= 1).all()
