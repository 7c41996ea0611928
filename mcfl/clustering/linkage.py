"""Agglomerative clustering on a precomputed distance matrix: complete, average or Ward
linkage, down to a number of clusters and, optionally, while clusters are closer than a
threshold.

CFL (Sattler et al., "Clustered Federated Learning: Model-Agnostic Distributed Multitask
Optimization Under Privacy Constraints", 2020) bipartitions a cluster's clients by complete
linkage on the negated cosine similarity of their updates (two clusters); FlexCFL groups
clients by complete linkage on their MADC matrix; FL+HC (Briggs et al. 2020) clusters client
updates by Ward linkage under a distance threshold; PACFL (Vahidian et al. 2023) clusters
principal angles by average linkage under a threshold.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

LINKAGES = ("complete", "average", "ward")


def complete_linkage(
    distance: jax.Array, num_clusters: int, mask: Optional[jax.Array] = None
) -> jax.Array:
    """`agglomerative` with complete linkage down to exactly `num_clusters` clusters."""
    return agglomerative(distance, num_clusters, mask)


def _joined_distance(method: str, dist, size, a, b):
    """[n] distances from the union of clusters a and b to every cluster (Lance-Williams;
    Ward's on squared distances)."""
    if method == "complete":
        return jnp.maximum(dist[a], dist[b])
    size_a, size_b = size[a], size[b]
    if method == "average":
        return (size_a * dist[a] + size_b * dist[b]) / (size_a + size_b)
    total = size_a + size_b + size
    return ((size_a + size) * dist[a] + (size_b + size) * dist[b] - size * dist[a, b]) / total


def agglomerative(
    distance: jax.Array,
    num_clusters: int,
    mask: Optional[jax.Array] = None,
    method: str = "complete",
    threshold: Optional[jax.Array | float] = None,
) -> jax.Array:
    """[n] int32 cluster labels from agglomerative clustering of `distance` [n, n] (symmetric;
    its diagonal is ignored), as scipy.cluster.hierarchy.linkage with `method` (complete,
    average or ward; ward expects Euclidean distances).

    Starting from singletons, the two closest clusters are merged until `num_clusters`
    remain; with a `threshold`, merging then goes on while the closest two are nearer than it
    (fewer clusters; sklearn's ``distance_threshold``). Cluster distances follow the
    Lance-Williams update of `method`. The merges run in one `lax.fori_loop` on a masked n x n
    matrix of cluster distances, each cluster kept in the row of its smallest member (O(n^3)
    time, O(n^2) memory). Only points where `mask` [n] is true take part; the others get label
    -1. Labels are 0, 1, ... numbered in the order of each cluster's smallest member; with
    fewer members than `num_clusters`, each member is its own cluster.
    """
    if method not in LINKAGES:
        raise ValueError(f"unknown linkage {method!r}; allowed: {', '.join(LINKAGES)}")
    n = distance.shape[0]
    active = jnp.ones(n, bool) if mask is None else jnp.asarray(mask, bool)  # [n]
    index = jnp.arange(n)
    upper = index[:, None] < index[None, :]  # [n, n] each pair once, as (i < j)
    dist = jnp.asarray(distance)
    dist = dist.astype(jnp.promote_types(dist.dtype, jnp.float32))  # [n, n]
    # Cap real distances below +inf so that an infinite distance still beats an invalid pair.
    dist = jnp.minimum(dist, jnp.finfo(dist.dtype).max)
    if method == "ward":
        dist = jnp.square(dist)  # Lance-Williams for Ward works on squared distances
    num_merges = jnp.maximum(jnp.sum(active) - num_clusters, 0)
    limit = None
    if threshold is not None:
        limit = jnp.asarray(threshold, dist.dtype)
        if method == "ward":  # (a negative threshold, merging nothing, stays negative)
            limit = jnp.where(limit > 0, jnp.square(limit), limit)

    def merge(step, carry):
        dist, active, root, size = carry
        valid = upper & active[:, None] & active[None, :]  # [n, n]
        candidates = jnp.where(valid, dist, jnp.inf)
        flat = jnp.argmin(candidates)
        a, b = flat // n, flat % n  # a < b: cluster b joins cluster a
        go = step < num_merges
        if limit is not None:
            go = go | (candidates[a, b] < limit)
        go = go & (jnp.sum(active) > 1)
        joined = _joined_distance(method, dist, size, a, b)
        merged = (dist.at[a, :].set(joined).at[:, a].set(joined), active.at[b].set(False),
                  jnp.where(root == b, a, root), size.at[a].add(size[b]))
        return jax.tree.map(lambda new, old: jnp.where(go, new, old), merged, carry)

    steps = num_merges if limit is None else n - 1
    size = jnp.ones(n, dist.dtype)
    _, roots_active, root, _ = jax.lax.fori_loop(0, steps, merge, (dist, active, index, size))
    cluster_number = jnp.cumsum(roots_active) - 1  # [n] rank of each remaining root
    return jnp.where(active, cluster_number[root], -1).astype(jnp.int32)
