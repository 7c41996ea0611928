"""Density-based clustering with no K given, as pure JAX on a [N, d] matrix of points: DBSCAN
with its radius at the knee of the nearest-neighbour distances (FLUX's server, Fenoglio et al.,
NeurIPS 2025; DBSCAN: Ester et al., KDD 1996; the knee: Kneedle, Satopaa et al., 2011).

With ``min_samples = 2`` (FLUX's setting) every point with another within `eps` is a core
point, so DBSCAN's clusters are the connected components of the graph joining points closer
than `eps`, and a point with no such neighbour is noise; FLUX makes each noise point a cluster
of its own, which is what the components give it. The components are found by propagating the
smallest label over edges (at most N sweeps of an [N, N] min), fixed shapes throughout.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from mcfl.clustering.distances import squared_distances


def pairwise_distances(points: jax.Array, others: Optional[jax.Array] = None) -> jax.Array:
    """[N, M] Euclidean distances of `points` [N, d] to `others` [M, d] (default: `points`)."""
    return jnp.sqrt(squared_distances(points, points if others is None else others))


def knee_radius(distances: jax.Array) -> jax.Array:
    """The radius at the knee of the sorted nearest-neighbour distances of `distances` [N, N]:
    the sorted curve y_0 <= ... <= y_{N-1} (convex, increasing) is scaled to [0, 1] on both axes
    and the knee is where it lies farthest below the diagonal, ``argmax_i x_i - y_i`` (Kneedle's
    difference curve; with one knee, what kneed's detector reports). A flat curve: its value."""
    n = distances.shape[0]
    nearest = jnp.min(distances + jnp.diag(jnp.full((n,), jnp.inf)), axis=1)
    y = jnp.sort(nearest)
    span = y[-1] - y[0]
    x_scaled = jnp.arange(n, dtype=y.dtype) / jnp.maximum(n - 1, 1)
    y_scaled = jnp.where(span > 0, (y - y[0]) / jnp.where(span > 0, span, 1.0), 0.0)
    return y[jnp.argmax(x_scaled - y_scaled)]


def components(adjacent: jax.Array) -> jax.Array:
    """[N] connected-component labels of the symmetric boolean graph `adjacent` [N, N],
    numbered 0.. in the order of each component's first point."""
    n = adjacent.shape[0]
    big = jnp.int32(n)

    def sweep(carry):
        labels, _ = carry
        through = jnp.min(jnp.where(adjacent, labels[None, :], big), axis=1)
        new = jnp.minimum(labels, through)
        return new, jnp.any(new != labels)

    labels, _ = jax.lax.while_loop(lambda c: c[1], sweep,
                                   (jnp.arange(n, dtype=jnp.int32), jnp.bool_(True)))
    roots = labels == jnp.arange(n)  # each component's smallest point is its root
    number = jnp.cumsum(roots) - 1
    return number[labels].astype(jnp.int32)


def dbscan_components(points: jax.Array, eps: jax.Array) -> jax.Array:
    """[N] DBSCAN labels of `points` [N, d] with ``min_samples = 2`` and radius `eps`, every
    noise point its own cluster (FLUX's rule); numbered 0.. by first point."""
    distances = pairwise_distances(points)
    return components(distances <= eps)
