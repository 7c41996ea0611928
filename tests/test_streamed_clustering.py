"""Streamed clustering (mcfl.clustering.streamed) against the in-memory functions it stands in
for (same key, same labels), and scikit-learn as an oracle. Tiny planted problems, read in
chunks that do not divide the number of rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from mcfl.algorithms.clustered.shared import cluster_means
from mcfl.clustering.kmeans import GRAM_RATIO, kmeans
from mcfl.clustering.robust import trimmed_kmeans
from mcfl.clustering.streamed import (
    ArraySource,
    cluster_means_streamed,
    kmeans_streamed,
    trimmed_kmeans_streamed,
)

KMEANS = jax.jit(kmeans, static_argnames=("k", "restarts", "max_iter"))
TRIMMED = jax.jit(trimmed_kmeans, static_argnames=("k", "trim", "centroid", "iterations",
                                                   "restarts"))
RESTARTS = 6
KEY = jax.random.PRNGKey(3)


def planted(n: int, d: int, k: int, seed: int, outliers: int = 0) -> np.ndarray:
    """n rows around k centers far apart (spread 10 per coordinate, noise 0.5), then
    `outliers` rows far from all of them."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(k, d)) * 10
    x = centers[rng.integers(0, k, n)] + rng.normal(size=(n, d)) * 0.5
    x[:outliers] = rng.normal(size=(outliers, d)) * 100
    return x.astype(np.float32)


class RowsOnly:
    """A source with chunks of irregular sizes (the later ones larger) and no `columns`,
    counting its passes."""

    def __init__(self, x, sizes=(5, 11, 3, 17)):
        self.array, self.sizes, self.passes = x, sizes, 0
        self.num_rows, self.dim = x.shape

    def chunks(self):
        self.passes += 1
        lo, i = 0, 0
        while lo < self.num_rows:
            hi = min(lo + self.sizes[i % len(self.sizes)], self.num_rows)
            yield lo, self.array[lo:hi]
            lo, i = hi, i + 1

    def rows(self, index):
        return self.array[np.asarray(index)]


def assert_same_kmeans(streamed, in_memory, exact_centers=False):
    np.testing.assert_array_equal(np.asarray(streamed.labels), np.asarray(in_memory.labels))
    assert int(streamed.n_iter) == int(in_memory.n_iter)
    np.testing.assert_allclose(float(streamed.inertia), float(in_memory.inertia), rtol=1e-4)
    if exact_centers:
        np.testing.assert_array_equal(np.asarray(streamed.centers), np.asarray(in_memory.centers))
    else:
        np.testing.assert_allclose(np.asarray(streamed.centers), np.asarray(in_memory.centers),
                                   rtol=1e-5, atol=1e-4)


# (n, d, k, chunk): the last has d >= GRAM_RATIO n, where the in-memory kmeans clusters the
# rows' Gram embedding instead of the rows
PROBLEMS = [(60, 5, 3, 16), (150, 12, 4, 64), (200, 40, 2, 48), (25, 400, 2, 7)]


@pytest.mark.parametrize("n,d,k,chunk", PROBLEMS)
def test_kmeans_streamed_gives_kmeans_labels_and_sklearns_partition(n, d, k, chunk):
    x = planted(n, d, k, seed=n)
    assert (d >= GRAM_RATIO * n) == (n == 25)
    streamed = kmeans_streamed(KEY, ArraySource(x, chunk), k, RESTARTS)
    assert_same_kmeans(streamed, KMEANS(KEY, jnp.asarray(x), k, RESTARTS))
    oracle = KMeans(n_clusters=k, n_init=5, random_state=0).fit(x).labels_
    assert adjusted_rand_score(oracle, np.asarray(streamed.labels)) == 1.0


def test_kmeans_streamed_seeds_are_kmeans_seeds_with_and_without_weights():
    """With no iteration the centers are the k-means++ seeds, rows of x: equal bit for bit."""
    x = planted(60, 5, 3, seed=60)
    weights = np.random.default_rng(1).uniform(0.5, 2.0, 60).astype(np.float32)
    weights[[0, 7, 30]] = 0.0  # never drawn
    for w in (None, weights):
        streamed = kmeans_streamed(KEY, ArraySource(x, 16), 3, RESTARTS, max_iter=0, weights=w)
        in_memory = KMEANS(KEY, jnp.asarray(x), 3, RESTARTS, max_iter=0, weights=w)
        assert_same_kmeans(streamed, in_memory, exact_centers=True)


def test_weighted_kmeans_streamed_on_an_irregular_source():
    x = planted(150, 12, 4, seed=150)
    weights = np.random.default_rng(2).uniform(0.5, 2.0, 150).astype(np.float32)
    weights[[3, 40]] = 0.0
    source = RowsOnly(x)
    streamed = kmeans_streamed(KEY, source, 4, RESTARTS, weights=weights)
    assert_same_kmeans(streamed, KMEANS(KEY, jnp.asarray(x), 4, RESTARTS, weights=weights))


def test_kmeans_streamed_reseeds_empty_clusters_as_kmeans_does():
    """Three distinct points (integer coordinates: exact distances), k = 4: k-means++ seeds a
    point twice, the second copy's cluster is empty and takes the farthest row."""
    points = np.array([[0, 0, 0], [4, 0, 1], [0, 5, 2]], np.float32)
    x = np.repeat(points, [9, 11, 10], axis=0)[np.random.default_rng(4).permutation(30)]
    streamed = kmeans_streamed(KEY, ArraySource(x, 8), 4, RESTARTS)
    in_memory = KMEANS(KEY, jnp.asarray(x), 4, RESTARTS)
    assert_same_kmeans(streamed, in_memory, exact_centers=True)
    assert len(np.unique(np.asarray(streamed.labels))) == 3  # one cluster is left empty


@pytest.mark.parametrize("centroid", ["trimmed_mean", "median"])
def test_trimmed_kmeans_streamed_gives_trimmed_kmeans(centroid):
    x = planted(80, 6, 3, seed=80, outliers=4)
    labels, centers, trimmed = TRIMMED(KEY, jnp.asarray(x), 3, 0.05, centroid, 4, 4)
    assert np.asarray(trimmed)[:4].all()  # the outliers are left out
    # column blocks of 4 of the 6 columns: the last one padded; and chunks of rows without
    # `columns`
    for source in (ArraySource(x, 24), RowsOnly(x)):
        got = trimmed_kmeans_streamed(KEY, source, 3, 0.05, centroid, 4, 4, column_block=4)
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(labels))
        np.testing.assert_allclose(np.asarray(got[1]), np.asarray(centers), rtol=1e-5,
                                   atol=1e-4)
        np.testing.assert_array_equal(np.asarray(got[2]), np.asarray(trimmed))


def test_cluster_means_streamed_is_cluster_means():
    x = planted(50, 7, 3, seed=50)
    labels = np.random.default_rng(5).integers(0, 3, 50).astype(np.int32)  # cluster 3 empty
    labels[:2] = -1  # in no cluster
    weights = np.random.default_rng(6).uniform(0.0, 2.0, 50).astype(np.float32)
    for w in (None, weights):
        expected = cluster_means(jnp.asarray(x), jnp.asarray(labels), 4,
                                 None if w is None else jnp.asarray(w))
        for source in (ArraySource(x, 16), RowsOnly(x)):
            got = cluster_means_streamed(source, labels, 4, w)
            np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5,
                                       atol=1e-5)
    assert np.all(np.asarray(got)[3] == 0)


def test_restarts_share_their_passes_over_the_source():
    """One pass per k-means++ step and per iteration for all restarts together, plus one for
    the final labels; trimmed k-means: k - 1 seed passes, two per iteration, one final."""
    x = planted(60, 5, 3, seed=60)
    source = RowsOnly(x)
    result = kmeans_streamed(KEY, source, 3, RESTARTS, max_iter=3)
    assert int(result.n_iter) >= 1
    assert source.passes <= 3 + 3 + 1
    source.passes = 0
    trimmed_kmeans_streamed(KEY, source, 3, 0.05, "trimmed_mean", iterations=2, restarts=4)
    assert source.passes == 2 + 2 * 2 + 1
