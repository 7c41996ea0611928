"""Agglomerative clustering with complete linkage on a precomputed distance matrix.

CFL (Sattler et al., "Clustered Federated Learning: Model-Agnostic Distributed Multitask
Optimization Under Privacy Constraints", 2020) bipartitions a cluster's clients by complete
linkage on the negated cosine similarity of their updates (two clusters); FlexCFL groups
clients by complete linkage on their MADC matrix.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp


def complete_linkage(
    distance: jax.Array, num_clusters: int, mask: Optional[jax.Array] = None
) -> jax.Array:
    """[n] int32 cluster labels from complete-linkage agglomerative clustering of `distance`
    [n, n] (symmetric; its diagonal is ignored).

    Starting from singletons, the two closest clusters are merged until `num_clusters` remain;
    the distance between two clusters is the largest distance between their members. The merges
    run in one `lax.fori_loop` on a masked n x n matrix of cluster distances, each cluster kept
    in the row of its smallest member (O(n^3) time, O(n^2) memory). Only points where `mask`
    [n] is true take part; the others get label -1. Labels are 0..num_clusters-1, numbered in
    the order of each cluster's smallest member; with fewer members than `num_clusters`, each
    member is its own cluster.
    """
    n = distance.shape[0]
    active = jnp.ones(n, bool) if mask is None else jnp.asarray(mask, bool)  # [n]
    index = jnp.arange(n)
    upper = index[:, None] < index[None, :]  # [n, n] each pair once, as (i < j)
    dist = jnp.asarray(distance)
    dist = dist.astype(jnp.promote_types(dist.dtype, jnp.float32))  # [n, n]
    # Cap real distances below +inf so that an infinite distance still beats an invalid pair.
    dist = jnp.minimum(dist, jnp.finfo(dist.dtype).max)
    num_merges = jnp.maximum(jnp.sum(active) - num_clusters, 0)

    def merge(_, carry):
        dist, active, root = carry
        valid = upper & active[:, None] & active[None, :]  # [n, n]
        flat = jnp.argmin(jnp.where(valid, dist, jnp.inf))
        a, b = flat // n, flat % n  # a < b: cluster b joins cluster a
        joined = jnp.maximum(dist[a], dist[b])  # [n] complete linkage: the farthest members
        dist = dist.at[a, :].set(joined).at[:, a].set(joined)
        return dist, active.at[b].set(False), jnp.where(root == b, a, root)

    _, roots_active, root = jax.lax.fori_loop(0, num_merges, merge, (dist, active, index))
    cluster_number = jnp.cumsum(roots_active) - 1  # [n] rank of each remaining root
    return jnp.where(active, cluster_number[root], -1).astype(jnp.int32)
