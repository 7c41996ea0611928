"""Truncated SVD of wide client matrices and FlexCFL's client embeddings.

Client updates are few rows (n clients) of very many columns (d parameters). The SVD here goes
through the eigendecomposition of the small Gram matrix, so memory stays O(n^2 + k d) besides
the input, and no d x d matrix is ever formed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mcfl.clustering.distances import HIGHEST, cosine_similarity


def _top_eigenpairs(gram: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """The k largest singular values sqrt(max(eig, 0)) of a Gram matrix, descending, and their
    [m, k] eigenvectors."""
    eigvals, eigvecs = jnp.linalg.eigh(gram)  # ascending
    s = jnp.sqrt(jnp.maximum(eigvals[::-1][:k], 0.0))  # [k]
    return s, eigvecs[:, ::-1][:, :k]


def _divide_columns(a: jax.Array, s: jax.Array) -> jax.Array:
    """``a[:, j] / s[j]``, with 0 where ``s[j] == 0``."""
    return jnp.where(s > 0, a / jnp.where(s > 0, s, 1.0), 0.0)


def _sign_flip(u: jax.Array) -> jax.Array:
    """[k] signs making the largest-magnitude entry of each column of u positive (scikit-learn's
    ``svd_flip``)."""
    largest = jnp.take_along_axis(u, jnp.argmax(jnp.abs(u), axis=0)[None], axis=0)[0]  # [k]
    return jnp.where(largest < 0, -1.0, 1.0).astype(u.dtype)


def left_singular_from_gram(gram: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """``u [n, k], s [k]`` of the top-k singular triplets of an x [n, d] given only its Gram
    matrix ``x x^T`` [n, n] (`truncated_svd`'s u and s for n <= d, with its signs): for a
    matrix read in column blocks (``x x^T`` is a sum over them), `mcfl.runs.embedding`."""
    s, u = _top_eigenpairs(gram, k)
    return u * _sign_flip(u), s


def truncated_svd(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Top-k singular triplets of `x` [n, d]: ``u [n, k], s [k] (descending), vt [k, d]``.

    With n <= d, ``x x^T = U S^2 U^T`` (an n x n eigendecomposition) and ``V = x^T U / S``;
    with n > d the roles swap (``x^T x``, ``U = x V / S``). The Gram matrix is the smaller side,
    so no d x d matrix is formed for wide x. Directions of zero singular value are returned as
    zero vectors. Signs follow scikit-learn's ``svd_flip``: the largest-magnitude entry of each
    column of u is positive. `k` is static (at most min(n, d)).
    """
    x = jnp.asarray(x)
    n, d = x.shape
    if n <= d:
        s, u = _top_eigenpairs(jnp.matmul(x, x.T, precision=HIGHEST), k)  # [k], [n, k]
        v = _divide_columns(jnp.matmul(x.T, u, precision=HIGHEST), s)  # [d, k]
    else:
        s, v = _top_eigenpairs(jnp.matmul(x.T, x, precision=HIGHEST), k)  # [k], [d, k]
        u = _divide_columns(jnp.matmul(x, v, precision=HIGHEST), s)  # [n, k]
    signs = _sign_flip(u)
    return u * signs, s, (v * signs).T


def edc_embedding(x: jax.Array, k: int) -> jax.Array:
    """[n, k] FlexCFL's Euclidean-distance-of-decomposed-cosine embedding (Duan et al.,
    "Flexible Clustered Federated Learning for Client-Level Data Distribution Shift", Sec. on
    EDC): ``E_ij = cos(x_i, v_j)`` with v_j the top-k right singular vectors of the client
    update matrix `x` [n, d].

    Since ``x = U S V^T`` and the v_j are orthonormal, ``x_i . v_j = (U S)_ij``, so
    ``E_ij = (U S)_ij / ||x_i||`` (0 for a row of zero norm).
    """
    u, s, _ = truncated_svd(x, k)
    norms = jnp.linalg.norm(x, axis=1, keepdims=True)  # [n, 1]
    return jnp.where(norms > 0, u * s / jnp.where(norms > 0, norms, 1.0), 0.0)


def madc(x: jax.Array) -> jax.Array:
    """[n, n] FlexCFL's mean absolute difference of pairwise cosine similarity:
    ``MADC(i, j) = mean_{z != i, j} |M_iz - M_jz|`` with ``M = cosine_similarity(x)``; 0 on the
    diagonal.

    Rows are computed one at a time (`lax.map`), so memory is O(n^2), never [n, n, n].
    """
    n = x.shape[0]
    sim = cosine_similarity(x)  # [n, n]
    others = jnp.arange(n)

    def row(i):
        diff = jnp.abs(sim[i][None, :] - sim)  # [n (j), n (z)]
        keep = (others[None, :] != i) & (others[None, :] != others[:, None])  # z != i, z != j
        mean = jnp.sum(jnp.where(keep, diff, 0.0), axis=1) / max(n - 2, 1)  # [n]
        return jnp.where(others == i, 0.0, mean)

    return jax.lax.map(row, others)
