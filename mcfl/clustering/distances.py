"""Pairwise distances and similarities between rows (clients) of flat matrices."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def squared_distances(x: jax.Array, centers: jax.Array) -> jax.Array:
    """[n, K] squared Euclidean distances ``||x_i - c_k||^2``.

    Expanded as ``||x||^2 - 2 x c^T + ||c||^2`` so that no [n, K, d] difference tensor is formed;
    the cancellation error of the expansion can make tiny distances negative, so they are
    clipped at 0.
    """
    x_sq = jnp.sum(jnp.square(x), axis=1)  # [n]
    c_sq = jnp.sum(jnp.square(centers), axis=1)  # [K]
    cross = jnp.matmul(x, centers.T, precision=HIGHEST)  # [n, K]
    return jnp.maximum(x_sq[:, None] - 2.0 * cross + c_sq[None, :], 0.0)


def normalize_rows(x: jax.Array) -> jax.Array:
    """Rows divided by their Euclidean norm; rows of zero norm stay zero."""
    norms = jnp.linalg.norm(x, axis=1, keepdims=True)  # [n, 1]
    return x / jnp.where(norms > 0, norms, 1.0)


def cosine_similarity(x: jax.Array, y: Optional[jax.Array] = None) -> jax.Array:
    """[n, m] cosine similarity between the rows of `x` and the rows of `y` (default: `x`).

    A row of zero norm has similarity 0 with everything (as scikit-learn's
    ``cosine_similarity``).
    """
    x_unit = normalize_rows(x)  # [n, d]
    y_unit = x_unit if y is None else normalize_rows(y)  # [m, d]
    return jnp.matmul(x_unit, y_unit.T, precision=HIGHEST)
