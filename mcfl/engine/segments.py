"""Weighted per-segment sums and means of stacked trees: every aggregation of client models
into one model or K cluster models (FedAvg, the cluster M-steps)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mcfl.engine.training import PyTree


def segment_sums(tree: PyTree, segments: jax.Array, weights: jax.Array,
                 num_segments: int) -> tuple[PyTree, jax.Array]:
    """Weighted per-segment sums of a stacked tree [n, ...]: ([K, ...] sums of ``w_i x_i`` over
    the rows of each segment, [K] summed weights). A segment outside [0, K) (e.g. -1) counts
    in none. One [n, K] one-hot matmul per leaf: what accelerators do at full speed."""
    mix = jax.nn.one_hot(segments, num_segments) * weights.astype(jnp.float32)[:, None]
    sums = jax.tree.map(
        lambda leaf: jnp.tensordot(mix.T, leaf.astype(jnp.float32), axes=1,
                                   precision=jax.lax.Precision.HIGHEST), tree)
    return sums, jnp.sum(mix, axis=0)


def segment_mean(sums: PyTree, weight_sums: jax.Array, previous: PyTree) -> PyTree:
    """Weighted per-segment means; a segment with no weight keeps its `previous` value."""

    def mean(s, prev):
        w = weight_sums.reshape((-1,) + (1,) * (s.ndim - 1))
        return jnp.where(w > 0, s / jnp.maximum(w, 1e-30), prev).astype(prev.dtype)

    return jax.tree.map(mean, sums, previous)
