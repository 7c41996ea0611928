"""Partition recipes and planted clusters: counts add up, recipes hold, errors are clear."""

from __future__ import annotations

import numpy as np
import pytest

from mcfl.config import RunConfig
from mcfl.data import partition, partition_arrays
from mcfl.data.arrays import LabelledArrays
from mcfl.data.spec import parse_partition
from mcfl.errors import ConfigError, DataError

RNG = np.random.default_rng


def labels_of(counts_per_class):
    return np.repeat(np.arange(len(counts_per_class)), counts_per_class)


def classes_per_client(owner, labels):
    used = owner >= 0
    pairs = np.unique(np.stack([owner[used], labels[used]]), axis=1)
    return np.bincount(pairs[0])


def test_shards_exact_classes_every_row_used():
    labels = labels_of([103, 97, 120, 88, 100, 110, 90, 95, 105, 92])
    owner = partition.shards(labels, 40, 3, 10, RNG(0))
    assert (owner >= 0).all()  # every row used
    np.testing.assert_array_equal(classes_per_client(owner, labels), np.full(40, 3))
    with pytest.raises(DataError, match="between 1 and 10 classes per client.*got 11"):
        partition.shards(labels, 40, 11, 10, RNG(0))


def test_fedprox_mnist_recipe():
    labels = labels_of([700] * 10)
    owner = partition.fedprox_mnist(labels, 100, 10, RNG(0))
    for u in (0, 7, 99):  # client u holds classes u % 10 and (u + 1) % 10, >= 5 rows of each
        mine = labels[owner == u]
        assert set(mine) == {u % 10, (u + 1) % 10}
        assert min(np.bincount(mine, minlength=10)[[u % 10, (u + 1) % 10]]) >= 5
    used = (owner >= 0).sum()
    assert 7000 - 200 < used <= 7000  # floors leave a few rows unused, as in the paper
    sizes = np.bincount(owner[owner >= 0])
    assert sizes.max() > 5 * np.median(sizes)  # lognormal(0, 2) power law
    with pytest.raises(DataError, match="needs 5 samples for each of the 400 clients holding "
                                        "class 0 \\(2000\\), but it has 700"):
        partition.fedprox_mnist(labels, 2000, 10, RNG(0))


def test_ditto_fmnist_recipe():
    labels = labels_of([1000] * 10)
    owner = partition.ditto_fmnist(labels, 80, 10, RNG(0))
    np.testing.assert_array_equal(classes_per_client(owner, labels), np.full(80, 5))
    assert (owner >= 0).sum() > 0.9 * labels.size  # takes (nearly) the whole dataset


def test_planted_rotation_and_permutation():
    rng = RNG(0)
    x = rng.integers(0, 255, (40, 6, 6), dtype=np.uint8)
    y = rng.integers(0, 5, 40)
    arrays = LabelledArrays("toy", x, y, 5, np.ones(40, bool))
    rot = partition_arrays(arrays, parse_partition("rotated:4"), 8, 0.25, "none", seed=3)
    assert np.bincount(rot.true_cluster).tolist() == [2, 2, 2, 2]
    # Each stored image is its original rotated by 90 * cluster degrees: find it among the
    # originals by its label-free pixels.
    originals = {img.tobytes(): i for i, img in enumerate(x.astype(np.float32))}
    xtr, owner = np.asarray(rot.arrays.x_train), np.asarray(rot.arrays.train_owner)
    for img, c in zip(xtr, owner):
        k = rot.true_cluster[c]
        assert np.rot90(img, k=-k).tobytes() in originals
    perm = partition_arrays(arrays, parse_partition("permuted:3"), 9, 0.25, "none", seed=3)
    perms = partition.label_permutations(3, 5, RNG(1))
    assert (perms[0] == np.arange(5)).all() and len({p.tobytes() for p in perms}) == 3
    assert set(perm.true_cluster) == {0, 1, 2}
    with pytest.raises(DataError, match="needs image data"):
        partition.rotate_images(np.zeros((4, 60)), np.zeros(4, int), 2)


def test_planted_clusters_in_given_proportions():
    """rotated:4/4,3,2,1 over 240 clients: clusters of 96, 72, 48 and 24 clients in a random
    order; the spec prints back; malformed proportions are one line naming the part."""
    spec = parse_partition("rotated:4/4,3,2,1")
    assert spec.shares == (4.0, 3.0, 2.0, 1.0) and str(spec) == "rotated:4/4,3,2,1+iid"
    ids = partition.planted_cluster_ids(240, 4, RNG(0), spec.shares)
    np.testing.assert_array_equal(np.bincount(ids), [96, 72, 48, 24])
    assert not np.all(np.diff(ids) >= 0)  # shuffled
    uneven = partition.planted_cluster_ids(10, 3, RNG(0), (1.0, 1.0, 1.0))
    assert sorted(np.bincount(uneven)) == [3, 3, 4] and len(uneven) == 10
    for bad in ("rotated:4/1,2", "rotated:4/1,2,3,x", "rotated:2/1,-1", "dirichlet:0.5/1"):
        with pytest.raises(ConfigError, match="proportions"):
            parse_partition(bad)


def test_partition_specs():
    assert parse_partition("rotated:4+dirichlet:0.5") == ("dirichlet", 0.5, (("rotated", None),),
                                                          4, ())
    assert str(parse_partition("permuted:2")) == "permuted:2+iid"
    for bad, message in [
        ("dirichlet:0", r"alpha must be a finite number in \(0, 1e\+06\] .*got '0'"),
        ("dirichlet:-1", r"alpha must be a finite number in \(0, 1e\+06\] .*got '-1'"),
        ("dirichlet:inf", r"alpha must be a finite number .*got 'inf'"),
        ("shards", "needs an integer as in shards:2"),
        ("pathological", "unknown partition 'pathological'"),
        ("rotated:4+permuted:2", "at most one planted"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_partition(bad)
    with pytest.raises(ConfigError, match="comes split by its own users"):
        RunConfig(dataset="synthetic", partition="iid")
    with pytest.raises(ConfigError, match="'natural' needs per-user data"):
        RunConfig(dataset="digits", partition="natural")


def test_array_dataset_counts_add_up_and_true_cluster_kept():
    from mcfl.data.loaders import load_digits

    arrays = load_digits()
    ds = partition_arrays(arrays, parse_partition("rotated:2+dirichlet:0.3"), 50, 0.2, "scale", 0)
    assert ds.train_counts().sum() + ds.test_counts().sum() == len(arrays)
    assert ds.true_cluster.shape == (50,) and ds.arrays.x_train.dtype == np.float32
    with pytest.raises(DataError, match="1000 clients need at least 2000 samples"):
        partition_arrays(arrays, parse_partition("dirichlet:0.5"), 1000, 0.2, "scale", 0)


def test_cap_rows_keeps_at_most_n_random_rows_per_client():
    from mcfl.data.partition import cap_rows

    owner = np.array([0, 0, 0, 1, 1, -1, 2, 0, 1, 1])
    kept_sets = set()
    for seed in range(20):
        capped = cap_rows(owner, 2, np.random.default_rng(seed))
        assert np.all((capped == owner) | (capped == -1))  # rows only leave, never move
        assert np.bincount(capped[capped >= 0], minlength=3).tolist() == [2, 2, 1]
        assert capped[5] == -1
        kept_sets.add(tuple(np.flatnonzero(capped == 0)))
    assert len(kept_sets) > 1  # drawn at random, not the first rows


def test_samples_per_client_gives_every_client_n_rows():
    import mcfl
    from mcfl import load_dataset

    data = load_dataset(mcfl.RunConfig(dataset="digits", partition="rotated:2", clients=20,
                                       samples_per_client=30))
    total = data.train_counts() + data.test_counts()
    assert total.tolist() == [30] * 20
    with pytest.raises(mcfl.ConfigError, match="samples_per_client applies to datasets split"):
        mcfl.RunConfig(dataset="synthetic", samples_per_client=5)
