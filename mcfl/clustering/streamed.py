"""Clustering of the rows of an [n, d] matrix too large for memory (client models in a store on
disk), read chunk by chunk from a `RowSource`.

`kmeans_streamed` (k-means++ seeds, Arthur and Vassilvitskii 2007, then Lloyd's iterations)
and `trimmed_kmeans_streamed` (Cuesta-Albertos, Gordaliza and Matran 1997) give the labels of
`kmeans` and `trimmed_kmeans`: the same PRNG draws, the same steps. All restarts advance
together, so each seeding step and each iteration is one pass over the source (a chunk's
distances to every restart's centers in one matmul). Per-row state ([restarts, n] labels and
distances) is kept in memory; no [n, d] array is. Chunks are padded to one size, so each
per-chunk function compiles once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import partial
from typing import Optional, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from mcfl.clustering.distances import HIGHEST, squared_distances
from mcfl.clustering.kmeans import KMeansResult


class RowSource(Protocol):
    """The rows of a [num_rows, dim] float32 matrix. `chunks` yields (first row index, rows
    [b, dim]) in row order, covering every row once, b at most some chunk size; `rows` returns
    the rows at `index` (any order, repeats allowed)."""

    num_rows: int
    dim: int

    def chunks(self) -> Iterator[tuple[int, np.ndarray]]: ...
    def rows(self, index: np.ndarray) -> np.ndarray: ...


class ColumnSource(RowSource, Protocol):
    """A `RowSource` with the optional ``columns(lo, hi) -> [num_rows, hi - lo]``, which the
    median centroid reads (from a plain `RowSource` it takes a pass over the chunks)."""

    def columns(self, lo: int, hi: int) -> np.ndarray: ...


class ArraySource:
    """A `ColumnSource` over an in-memory [n, d] array, in chunks of `chunk` rows."""

    def __init__(self, x, chunk: int = 4096):
        self.array = np.asarray(x, np.float32)
        self.num_rows, self.dim = self.array.shape
        self.chunk = chunk

    def chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        for lo in range(0, self.num_rows, self.chunk):
            yield lo, self.array[lo:lo + self.chunk]

    def rows(self, index: np.ndarray) -> np.ndarray:
        return self.array[np.asarray(index, np.int64)]

    def columns(self, lo: int, hi: int) -> np.ndarray:
        return self.array[:, lo:hi]


def _pad(values: np.ndarray, size: int, fill=0) -> np.ndarray:
    """`values` [..., b] padded along its last axis to [..., size] with `fill`."""
    return np.pad(values, [(0, 0)] * (values.ndim - 1) + [(0, size - values.shape[-1])],
                  constant_values=fill)


def _padded_chunks(source: RowSource):
    """(first row, valid rows b, [size, d] chunk on the device) in row order, each padded with
    zero rows to the largest size seen so far (the first chunk's, for a regular source)."""
    size = 0
    for start, rows in source.chunks():
        rows = np.asarray(rows, np.float32)
        if not len(rows):
            continue  # nothing to add; and the column moments would divide by 0
        b = rows.shape[0]
        size = max(size, b)
        if b < size:  # (a copy only for a short chunk: a pass reads gigabytes)
            rows = np.concatenate([rows, np.zeros((size - b, rows.shape[1]), np.float32)])
        yield start, b, jax.device_put(rows)  # (no copy of a 64-byte aligned chunk on CPU)


def _in_flight(previous) -> None:
    """Wait for the previous chunk's outputs `previous` once this chunk's work is queued: at
    most two chunks are in flight. (Queued work holds its chunk: a pass whose reads outran the
    device held 5 GB of chunks at once, 60,000 MLP models.)"""
    if previous is not None:
        jax.block_until_ready(previous)


def _assemble(parts) -> np.ndarray:
    """[..., n] from a pass's per-row outputs [..., size] (chunks in row order), read back once
    the pass is over (at each chunk, the reading would wait for the device)."""
    return np.concatenate([np.asarray(values)[..., :b] for b, values in parts], axis=-1)


@jax.jit
def _column_moments(moments, chunk, b):
    """(count, mean [d], summed squared deviations [d]) with the chunk's b rows merged in (Chan,
    Golub and LeVeque's update: no cancellation of sum x^2 - n mean^2 on rows of large norm)."""
    count, mean, deviation = moments
    valid = (jnp.arange(chunk.shape[0]) < b)[:, None]
    chunk_mean = jnp.sum(jnp.where(valid, chunk, 0.0), axis=0) / b
    chunk_deviation = jnp.sum(jnp.where(valid, jnp.square(chunk - chunk_mean), 0.0), axis=0)
    total = count + b
    delta = chunk_mean - mean
    return (total, mean + delta * (b / total),
            deviation + chunk_deviation + jnp.square(delta) * (count * b / total))


@jax.jit
def _nearest(chunk, centers):
    """[R, size] closest of each restart's centers [R, k, d] and the squared distance to it: the
    chunk against all R k centers in one matmul."""
    r, k, d = centers.shape
    d2 = squared_distances(chunk, centers.reshape(r * k, d)).reshape(-1, r, k)
    return jnp.argmin(d2, axis=2).astype(jnp.int32).T, jnp.min(d2, axis=2).T


@partial(jax.jit, static_argnames="k", donate_argnums=(0, 1))
def _add_segment_sums(sums, totals, chunk, segments, weights, k):
    """`sums` [R, k, d] and `totals` [R, k] plus the chunk's rows, weighted by `weights` [size],
    by `segments` [R, size] (outside [0, k): none)."""
    mass = (segments[..., None] == jnp.arange(k)) * weights[None, :, None]  # [R, size, k]
    r, size, _ = mass.shape
    # One [R k, size] x [size, d] matmul: an einsum over r would broadcast the chunk to
    # [R, size, d] (5 GB for 20 restarts of 336 MLP models).
    by_row = jnp.transpose(mass, (0, 2, 1)).reshape(r * k, size)
    added = jnp.matmul(by_row, chunk, precision=HIGHEST).reshape(r, k, -1)
    return sums + added, totals + jnp.sum(mass, axis=1)


def _pass(source: RowSource, centers, weights: Optional[np.ndarray] = None,
          moments: bool = False):
    """One pass: [R, n] labels of and squared distances to the closest of `centers` [R, k, d];
    with `weights` [n], the [R, k, d] weighted sums of each cluster's rows; with `moments`,
    each column's summed squared deviation from its mean."""
    r, k, d = centers.shape
    labels, dist = [], []
    sums, totals = jnp.zeros((r, k, d)), jnp.zeros((r, k))
    stats = (jnp.float32(0), jnp.zeros(d), jnp.zeros(d))
    previous = None
    for start, b, chunk in _padded_chunks(source):
        chunk_labels, chunk_dist = _nearest(chunk, centers)
        labels.append((b, chunk_labels))
        dist.append((b, chunk_dist))
        _in_flight(previous)  # (before the sums it holds are donated below)
        if weights is not None:
            chunk_w = jnp.asarray(_pad(weights[start:start + b], chunk.shape[0]))
            sums, totals = _add_segment_sums(sums, totals, chunk, chunk_labels, chunk_w, k)
        if moments:
            stats = _column_moments(stats, chunk, b)
        previous = (chunk_dist, sums, totals, stats)
    return _assemble(labels), _assemble(dist), sums, stats[2]


@partial(jax.jit, static_argnames="uniform")
def _first_picks(keys, w, uniform=False):
    """Each restart's first seed and key of later draws, as `kmeans_plusplus_indices` (a row by
    weight) or, `uniform`, `trimmed_seeds` (a uniform row) split and draw them."""
    def one(key):
        first_key, loop_key = jax.random.split(key)
        if uniform:
            return jax.random.randint(first_key, (), 0, w.shape[0]), loop_key
        return jax.random.choice(first_key, w.shape[0], p=w / jnp.sum(w)), loop_key
    return jax.vmap(one)(keys)


@partial(jax.jit, static_argnames="num_trials")
def _draw_candidates(loop_keys, c, closest, w, num_trials):
    """[R, L] candidates for center c drawn by w_i D(x_i)^2 as `kmeans_plusplus_indices` does."""
    def one(loop_key, closest):
        cumulative = jnp.cumsum(w * closest)
        draws = jax.random.uniform(jax.random.fold_in(loop_key, c), (num_trials,))
        found = jnp.searchsorted(cumulative, draws * cumulative[-1])
        return jnp.minimum(found, w.shape[0] - 1)  # rounding can push a draw past the end
    return jax.vmap(one)(loop_keys, closest)


@jax.jit
def _keep_best(closest, d2, w):
    """Each restart's candidate (`d2` [R, L, n]) of least potential sum_i w_i D(x_i)^2 once
    added, and [R, n] the closest squared distances with it."""
    trial = jnp.minimum(closest[:, None], d2)
    potentials = jax.vmap(lambda t: jnp.matmul(t, w, precision=HIGHEST))(trial)  # [R, L]
    best = jnp.argmin(potentials, axis=1)
    return best, trial[jnp.arange(trial.shape[0]), best]


@partial(jax.jit, static_argnames="k")
def _fill_empty(labels, dist, w, k):
    """Each empty cluster given a row farthest from its center (the j-th empty the j-th
    farthest, zero weights last), as `lloyd` re-seeds: per restart the labels, and [R, k] the
    row moved into each cluster (n: none), its former label and its weight (0: none)."""
    n = labels.shape[1]
    num_far = min(k, n)

    def one(labels, dist):
        empty = jax.ops.segment_sum(w, labels, k) <= 0
        _, farthest = jax.lax.top_k(jnp.where(w > 0, dist, -1.0), num_far)
        rank = jnp.cumsum(empty) - 1
        moved = jnp.where(empty & (rank < num_far), farthest[jnp.clip(rank, 0, num_far - 1)], n)
        row = jnp.minimum(moved, n - 1)
        return (labels.at[moved].set(jnp.arange(k, dtype=labels.dtype), mode="drop"), moved,
                labels[row], jnp.where(moved < n, w[row], 0.0))

    return jax.vmap(one)(labels, dist)


@jax.jit
def _lloyd_step(state, running, sums, labels, w, moved_rows, former, moved_w):
    """`lloyd`'s state (iteration, centers, labels, squared shift, any label changed) of each
    running restart after one iteration: the pass's cluster sums, with the rows `_fill_empty`
    moved ([R, k, d]) moved, over their weights (a cluster without weight keeps its center)."""
    iteration, centers, previous, _, _ = state
    r, k, _ = centers.shape
    weighted = moved_w[..., None] * moved_rows
    restart = jnp.arange(r)[:, None]
    sums = sums.at[restart, jnp.arange(k)].add(weighted).at[restart, former].add(-weighted)
    totals = jax.vmap(lambda lab: jax.ops.segment_sum(w, lab, k))(labels)[..., None]
    new = jnp.where(totals > 0, sums / jnp.where(totals > 0, totals, 1.0), centers)
    stepped = (iteration + 1, new, labels, jnp.sum(jnp.square(new - centers), axis=(1, 2)),
               jnp.any(labels != previous, axis=1))
    return jax.tree.map(lambda a, b: jnp.where(running.reshape((r,) + (1,) * (a.ndim - 1)), a, b),
                        stepped, state)


def kmeans_streamed(key: jax.Array, source: RowSource, k: int, restarts: int = 20,
                    max_iter: int = 100, tol: float = 1e-4,
                    weights: Optional[np.ndarray] = None) -> KMeansResult:
    """`kmeans` of the rows of `source`: `restarts` greedy k-means++ seeds (Arthur and
    Vassilvitskii 2007) from ``jax.random.split(key, restarts)``, each followed by `lloyd`'s
    iterations; the run of least inertia is returned (FeSEM, Xie et al., Sec. 6.1). Passes over
    the source: k for the seeds (the first also gives the variances), one per iteration of the
    slowest restart (one that stopped keeps its state), one for the final labels. It never takes
    `kmeans`' Gram embedding (d >= 8 n: all [n, n] row products); the distances are the same,
    so are the labels (to rounding)."""
    n, d = source.num_rows, source.dim
    w = np.ones(n, np.float32) if weights is None else np.asarray(weights, np.float32)
    w_device = jnp.asarray(w)
    num_trials = 2 + int(math.log(k))
    first, loop_keys = _first_picks(jax.random.split(key, restarts), w_device)
    chosen = np.zeros((restarts, k), np.int64)
    chosen[:, 0] = np.asarray(first)
    first_rows = jnp.asarray(source.rows(chosen[:, 0]))[:, None]  # [R, 1, d]: one center each
    _, closest, _, deviation = _pass(source, first_rows, moments=True)
    threshold = np.float32(tol) * np.float32(jnp.mean(deviation / n))
    closest = jnp.asarray(closest)
    for c in range(1, k):
        candidates = np.asarray(_draw_candidates(loop_keys, c, closest, w_device, num_trials))
        d2 = _pass(source, jnp.asarray(source.rows(candidates.reshape(-1)))[:, None])[1]
        best, closest = _keep_best(closest, jnp.asarray(d2.reshape(restarts, num_trials, n)),
                                   w_device)
        chosen[:, c] = candidates[np.arange(restarts), np.asarray(best)]
    centers = jnp.asarray(source.rows(chosen.reshape(-1)).reshape(restarts, k, d))

    state = (jnp.zeros(restarts, jnp.int32), centers, jnp.full((restarts, n), -1, jnp.int32),
             jnp.full(restarts, jnp.inf), jnp.ones(restarts, bool))
    # `lloyd`'s loop condition, per restart
    while (running := (state[0] < max_iter) & (state[3] > threshold) & state[4]).any():
        labels, dist, sums, _ = _pass(source, state[1], w)
        labels, moved, former, moved_w = _fill_empty(jnp.asarray(labels), jnp.asarray(dist),
                                                     w_device, k)
        moved = np.asarray(moved)
        moved_rows = state[1]  # any [R, k, d] when nothing moved (moved_w 0); else read them
        if (moved < n).any():
            rows = source.rows(np.minimum(moved, n - 1).reshape(-1))
            moved_rows = jnp.asarray(rows.reshape(restarts, k, d))
        state = _lloyd_step(state, running, sums, labels, w_device, moved_rows, former, moved_w)

    iteration, centers = state[:2]
    labels, dist, _, _ = _pass(source, centers)
    inertia = np.asarray(jnp.sum(w_device * jnp.asarray(dist), axis=1))
    best = int(np.argmin(inertia))
    return KMeansResult(centers[best], jnp.asarray(labels[best]), jnp.asarray(inertia[best]),
                        iteration[best])


@partial(jax.jit, static_argnames="num_trimmed")
def _trimmed_pick(loop_keys, c, nearest, num_trimmed):
    """Seed c of each restart as `trimmed_seeds` draws it (the `num_trimmed` farthest excluded)."""
    def one(loop_key, d2):
        d2 = d2.at[jax.lax.top_k(d2, num_trimmed)[1]].set(0.0)
        p = d2 / jnp.maximum(jnp.sum(d2), 1e-30)
        return jax.random.choice(jax.random.fold_in(loop_key, c), d2.shape[0], p=p)
    return jax.vmap(one)(loop_keys, nearest)


@partial(jax.jit, static_argnames=("num_trimmed", "k"))
def _trim(labels, dist, num_trimmed, k):
    """Per restart, [R, n] labels with the `num_trimmed` rows farthest from their centers at k
    (in no cluster), and [R] the summed squared distances of the rest."""
    def one(labels, dist):
        trimmed = jnp.zeros(labels.shape, bool).at[jax.lax.top_k(dist, num_trimmed)[1]].set(True)
        return jnp.where(trimmed, k, labels), jnp.sum(jnp.where(trimmed, 0.0, dist))
    return jax.vmap(one)(labels, dist)


@partial(jax.jit, static_argnames="k")
def _block_medians(block, kept, k):
    """[R, k, width] coordinate-wise median of each cluster's rows of `block` [n, width] by
    `kept` [R, n] (k: trimmed; an empty cluster's median is 0), and [R, k] counts. One sort per
    restart, by (cluster, value), instead of one per cluster."""
    def one(segments):
        keys = jnp.broadcast_to(segments[:, None], block.shape)
        _, ordered = jax.lax.sort((keys, block), dimension=0, num_keys=2)
        counts = jax.ops.segment_sum(jnp.ones_like(segments), segments, k)
        starts = jnp.cumsum(counts) - counts
        low = starts + jnp.maximum((counts - 1) // 2, 0)
        median = 0.5 * (ordered[low] + ordered[starts + counts // 2])
        return jnp.where((counts > 0)[:, None], median, 0.0), counts
    return jax.vmap(one)(kept)


def _kept_medians(source: RowSource, kept: np.ndarray, k: int, block: int):
    """[R, k, d] medians of each cluster's kept rows, and [R, k] counts. A median needs all of
    a cluster's values of a coordinate at once, which row chunks never give: the source is read
    once per block of `block` columns (all n rows of a block must fit in memory)."""
    d = source.dim
    width = min(block, d)
    medians = np.zeros((len(kept), k, d), np.float32)
    for lo in range(0, d, width):
        hi = min(lo + width, d)
        if hasattr(source, "columns"):
            columns = np.asarray(source.columns(lo, hi), np.float32)
        else:
            columns = np.concatenate([np.asarray(rows)[:, lo:hi] for _, rows in source.chunks()])
        # padded to one width: one compilation
        values, counts = _block_medians(jnp.asarray(_pad(columns, width)), kept, k)
        medians[:, :, lo:hi] = np.asarray(values)[:, :, :hi - lo]
    return jnp.asarray(medians), counts


def _segment_means(source: RowSource, segments: np.ndarray, weights: np.ndarray, k: int):
    """[R, k, d] weighted means of the rows of each segment of `segments` [R, n] (0 for a
    segment without weight; outside [0, k): none), and [R, k] their weights: one pass."""
    sums, totals = jnp.zeros((len(segments), k, source.dim)), jnp.zeros((len(segments), k))
    for start, b, chunk in _padded_chunks(source):
        size = chunk.shape[0]
        _in_flight((sums, totals))  # (the previous chunk's, before they are donated)
        sums, totals = _add_segment_sums(
            sums, totals, chunk, jnp.asarray(_pad(segments[:, start:start + b], size, -1)),
            jnp.asarray(_pad(weights[start:start + b], size)), k)
    means = sums / jnp.maximum(totals, 1e-30)[..., None]
    return jnp.where((totals > 0)[..., None], means, 0.0), totals


def trimmed_kmeans_streamed(key: jax.Array, source: RowSource, k: int, trim: float = 0.05,
                            centroid: str = "trimmed_mean", iterations: int = 8,
                            restarts: int = 10, column_block: int = 1024):
    """`trimmed_kmeans` (Cuesta-Albertos, Gordaliza and Matran 1997; Ghosh et al. 2019) of the
    rows of `source`: the seeds `trimmed_seeds` draws (k - 1 passes), then `iterations` times
    assign every row to its nearest center (one pass), leave out the ceil(trim n) farthest, and
    move each center to the mean (one pass) or, with ``centroid="median"``, the coordinate-wise
    median (one read per block of `column_block` columns, see `_kept_medians`) of its rows left
    in; a center with none stays. Of the restarts, the one of least trimmed cost is kept.
    Returns (labels [n], centers [k, d], trimmed [n] bool)."""
    n, d = source.num_rows, source.dim
    num_trimmed = int(-(-trim * n // 1))
    first, loop_keys = _first_picks(jax.random.split(key, restarts), jnp.ones(n), uniform=True)
    seeds = np.zeros((restarts, k, d), np.float32)
    seeds[:, 0] = source.rows(np.asarray(first))
    nearest = np.full((restarts, n), np.inf, np.float32)
    for c in range(1, k):
        # squared distance to the nearest seed so far
        nearest = np.minimum(nearest, _pass(source, jnp.asarray(seeds[:, c - 1:c]))[1])
        pick = _trimmed_pick(loop_keys, c, jnp.asarray(nearest), num_trimmed)
        seeds[:, c] = source.rows(np.asarray(pick))

    centers = jnp.asarray(seeds)
    for _ in range(iterations):
        labels, dist, _, _ = _pass(source, centers)
        kept = np.asarray(_trim(jnp.asarray(labels), jnp.asarray(dist), num_trimmed, k)[0])
        if centroid == "median":
            new, counts = _kept_medians(source, kept, k, column_block)
        else:
            new, counts = _segment_means(source, kept, np.ones(n, np.float32), k)
        centers = jnp.where((counts > 0)[..., None], new, centers)
    labels, dist, _, _ = _pass(source, centers)
    kept, cost = _trim(jnp.asarray(labels), jnp.asarray(dist), num_trimmed, k)
    best = int(jnp.argmin(cost))
    return jnp.asarray(labels[best]), centers[best], kept[best] == k


def cluster_means_streamed(source: RowSource, labels, k: int,
                           weights: Optional[np.ndarray] = None) -> jax.Array:
    """[k, d] weighted mean of each cluster's rows in one pass (`cluster_means` of
    mcfl.algorithms.clustered.shared on a source); a cluster without weight gets zeros, and a label
    outside [0, k) counts in none."""
    w = np.ones(source.num_rows) if weights is None else weights
    return _segment_means(source, np.asarray(labels, np.int32)[None], np.asarray(w, np.float32),
                          k)[0][0]
