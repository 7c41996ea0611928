"""k-means with k-means++ seeding, empty-cluster re-seeding and batched restarts.

FeSEM (Xie et al., "Multi-center federated learning: clients clustering for better
personalization", Sec. 6.1) clusters client models with k-means from 20 random restarts and
keeps the run with the smallest intra-cluster distance; `kmeans` does the same with all restarts
run together under `jax.vmap`. Everything works on a flat [n, d] matrix, one row per client.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from mcfl.clustering.distances import HIGHEST, squared_distances


class KMeansResult(NamedTuple):
    """The outcome of a k-means run."""

    centers: jax.Array  # [K, d]
    labels: jax.Array  # [n] int32, the closest center of each point
    inertia: jax.Array  # scalar: sum_i w_i ||x_i - centers[labels_i]||^2
    n_iter: jax.Array  # scalar int32: Lloyd iterations run


def _point_weights(x: jax.Array, weights: Optional[jax.Array]) -> jax.Array:
    if weights is None:
        return jnp.ones(x.shape[0], x.dtype)
    return jnp.asarray(weights, x.dtype)


def kmeans_plusplus(
    key: jax.Array, x: jax.Array, k: int, weights: Optional[jax.Array] = None
) -> jax.Array:
    """[k, d] initial centers by greedy k-means++: the rows `kmeans_plusplus_indices` picks."""
    return jnp.asarray(x)[kmeans_plusplus_indices(key, x, k, weights)]


def kmeans_plusplus_indices(
    key: jax.Array, x: jax.Array, k: int, weights: Optional[jax.Array] = None
) -> jax.Array:
    """[k] int32 rows of `x` chosen as initial centers by greedy k-means++ (Arthur &
    Vassilvitskii 2007), as scikit-learn's ``kmeans_plusplus`` does it.

    The first center is a point drawn with probability proportional to its weight. Each later
    center draws ``2 + floor(ln k)`` candidates with probability proportional to
    ``w_i * D(x_i)^2`` (D: distance to the closest center so far) and keeps the candidate that
    lowers the potential ``sum_i w_i D(x_i)^2`` most. `k` is static.
    """
    x = jnp.asarray(x)
    n = x.shape[0]
    w = _point_weights(x, weights)  # [n]
    num_trials = 2 + int(math.log(k))
    first_key, loop_key = jax.random.split(key)
    first = jax.random.choice(first_key, n, p=w / jnp.sum(w))
    chosen = jnp.zeros((k,), jnp.int32).at[0].set(first)
    closest = squared_distances(x[first][None], x)[0]  # [n]

    def add_center(c, carry):
        chosen, closest = carry
        cumulative = jnp.cumsum(w * closest)  # [n]
        draws = jax.random.uniform(jax.random.fold_in(loop_key, c), (num_trials,))
        candidates = jnp.searchsorted(cumulative, draws * cumulative[-1])  # [L]
        candidates = jnp.minimum(candidates, n - 1)  # rounding can push a draw past the end
        trial = jnp.minimum(closest[None], squared_distances(x[candidates], x))  # [L, n]
        potentials = jnp.matmul(trial, w, precision=HIGHEST)  # [L]
        best = jnp.argmin(potentials)
        return chosen.at[c].set(candidates[best]), trial[best]

    chosen, _ = jax.lax.fori_loop(1, k, add_center, (chosen, closest))
    return chosen


def _assign(x: jax.Array, centers: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[n] int32 closest center of each point, and [n] its squared distance."""
    d2 = squared_distances(x, centers)  # [n, K]
    labels = jnp.argmin(d2, axis=1).astype(jnp.int32)
    return labels, jnp.take_along_axis(d2, labels[:, None], axis=1)[:, 0]


def _cluster_mass(labels: jax.Array, w: jax.Array, k: int) -> jax.Array:
    """[n, K] one-hot assignment scaled by the point weights."""
    return (labels[:, None] == jnp.arange(k, dtype=labels.dtype)[None, :]) * w[:, None]


def _relocate_empty(labels: jax.Array, dist: jax.Array, w: jax.Array, k: int) -> jax.Array:
    """Labels with each empty cluster given one of the points farthest from their centers.

    The j-th empty cluster (in cluster order) takes the j-th farthest point, so several empty
    clusters take distinct points, and the point leaves its old cluster (scikit-learn's
    ``_relocate_empty_clusters``). Points of zero weight are taken last: they cannot fill a
    cluster.
    """
    n = labels.shape[0]
    empty = jnp.sum(_cluster_mass(labels, w, k), axis=0) <= 0  # [K]
    num_far = min(k, n)
    _, farthest = jax.lax.top_k(jnp.where(w > 0, dist, -1.0), num_far)  # [min(K, n)]
    rank = jnp.cumsum(empty) - 1  # [K] position of each empty cluster among the empty ones
    point = farthest[jnp.clip(rank, 0, num_far - 1)]  # [K]
    point = jnp.where(empty & (rank < num_far), point, n)  # n: no point (dropped below)
    return labels.at[point].set(jnp.arange(k, dtype=labels.dtype), mode="drop")


def lloyd(
    x: jax.Array,
    centers: jax.Array,
    max_iter: int = 100,
    tol: float = 1e-4,
    weights: Optional[jax.Array] = None,
) -> KMeansResult:
    """Lloyd's k-means iterations from `centers` [K, d] on the points `x` [n, d].

    Each iteration assigns every point to its closest center, re-seeds empty clusters at the
    farthest points (`_relocate_empty`; K never changes) and moves each center to the weighted
    mean of its points. It stops after `max_iter` iterations, when the labels no longer change
    (scikit-learn's strict convergence; rounding can leave a tiny nonzero shift then), or when
    the total squared center shift is at most ``tol * mean_j Var(x[:, j])`` (the tolerance
    scaled as scikit-learn scales it). The returned labels and inertia are those of the final
    centers.
    """
    x = jnp.asarray(x)
    n = x.shape[0]
    k = centers.shape[0]
    w = _point_weights(x, weights)  # [n]
    threshold = tol * jnp.mean(jnp.var(x, axis=0))

    def cond(state):
        i, _, _, shift, changed = state
        return (i < max_iter) & (shift > threshold) & changed

    def body(state):
        i, centers, previous, _, _ = state
        labels, dist = _assign(x, centers)
        labels = _relocate_empty(labels, dist, w, k)
        mass = _cluster_mass(labels, w, k)  # [n, K]
        sums = jnp.matmul(mass.T, x, precision=HIGHEST)  # [K, d]
        total = jnp.sum(mass, axis=0)[:, None]  # [K, 1]
        new = jnp.where(total > 0, sums / jnp.where(total > 0, total, 1.0), centers)
        shift = jnp.sum(jnp.square(new - centers))
        return i + 1, new, labels, shift, jnp.any(labels != previous)

    init = (
        jnp.int32(0),
        jnp.asarray(centers, x.dtype),
        jnp.full((n,), -1, jnp.int32),  # no previous labels
        jnp.array(jnp.inf, x.dtype),
        jnp.array(True),
    )
    n_iter, centers, _, _, _ = jax.lax.while_loop(cond, body, init)
    labels, dist = _assign(x, centers)
    return KMeansResult(centers, labels, jnp.sum(w * dist), n_iter)


# Above this many dimensions per point, k-means runs on the points' Gram embedding.
GRAM_RATIO = 8


def centred_gram(x: jax.Array, chunk: int = 1 << 16) -> jax.Array:
    """[n, n] Gram matrix of the rows of `x` [n, d] minus their mean, ``(X - m)(X - m)^T``,
    accumulated over chunks of `chunk` columns so that no centred [n, d] copy is held.
    Centring first matters: rows sharing most of their norm (client models from one start)
    would otherwise lose their small differences to float32 rounding of the large products."""
    n, d = x.shape
    mean = jnp.mean(x, axis=0)  # [d]

    def add(gram, lo, width):
        part = (jax.lax.dynamic_slice_in_dim(x, lo, width, axis=1)
                - jax.lax.dynamic_slice_in_dim(mean, lo, width))  # [n, width]
        return gram + jnp.matmul(part, part.T, precision=HIGHEST)

    full = d // chunk
    gram = jnp.zeros((n, n), x.dtype)
    if full:
        gram = jax.lax.fori_loop(0, full, lambda i, g: add(g, i * chunk, chunk), gram)
    if d % chunk:
        gram = add(gram, full * chunk, d % chunk)
    return gram


def gram_embedding(x: jax.Array) -> jax.Array:
    """[n, n] coordinates of the rows of `x` [n, d], centred, in an orthonormal basis of their
    span: with ``(X - m)(X - m)^T = V diag(s) V^T`` (`centred_gram`), the rows of
    ``V diag(sqrt(s))``. Every distance between rows, and between rows and weighted means of
    rows, is that of `x` (to rounding); eigenvalues rounding leaves negative count as 0."""
    gram = centred_gram(x)
    s, v = jnp.linalg.eigh(0.5 * (gram + gram.T))
    return v * jnp.sqrt(jnp.maximum(s, 0.0))[None, :]


def kmeans(
    key: jax.Array,
    x: jax.Array,
    k: int,
    restarts: int = 20,
    max_iter: int = 100,
    tol: float = 1e-4,
    weights: Optional[jax.Array] = None,
) -> KMeansResult:
    """k-means on `x` [n, d]: `restarts` independent k-means++ seeds, each followed by `lloyd`,
    all run together with `jax.vmap`; returns the run of lowest inertia.

    FeSEM (Xie et al., "Multi-center federated learning", Sec. 6.1) runs k-means from 20 random
    restarts and keeps the smallest intra-cluster distance; this is the default. `k`,
    `restarts` and `max_iter` are static (``jax.jit(kmeans, static_argnames=("k", "restarts",
    "max_iter"))``).

    With far fewer points than dimensions (d >= `GRAM_RATIO` n: a few hundred client CNNs of
    millions of parameters), the runs work on `gram_embedding` (k-means only sees distances
    and means, which it keeps): one [n, n] Gram product instead of an [n, d] x [d, K] product
    per iteration and restart (FeSEM's start on 500 FashionMNIST CNNs: BENCHMARKS.md). The
    tolerance is rescaled to keep its meaning (mean variance per dimension of `x`), and the
    centers returned are the (weighted) means of the final clusters.
    """
    n, d = x.shape
    gram = d >= GRAM_RATIO * n
    points = gram_embedding(x) if gram else x
    run_tol = tol * points.shape[1] / d  # sum of variances / d, whichever the coordinates

    def one_run(run_key):
        return lloyd(points, kmeans_plusplus(run_key, points, k, weights), max_iter, run_tol,
                     weights)

    runs = jax.vmap(one_run)(jax.random.split(key, restarts))
    best = jax.tree.map(lambda leaf: leaf[jnp.argmin(runs.inertia)], runs)
    if not gram:
        return best
    mass = _cluster_mass(best.labels, _point_weights(x, weights), k)  # [n, K]
    total = jnp.sum(mass, axis=0)[:, None]
    sums = jnp.matmul(mass.T, x, precision=HIGHEST)  # [K, d]
    return best._replace(centers=sums / jnp.where(total > 0, total, 1.0))
