"""Canary clients: an empirical check of a DP run's guarantee (Andrew, Kairouz, Oh, Oprea,
McMahan and Suriyakumar, "One-shot Empirical Privacy Estimation for Federated Learning",
ICLR 2024).

`--dp-canaries K` adds K canary clients to a run whose server keeps one global model. Canary j
sends, every round it joins (independently, with the clients' rate q = S / N), the update
``C u_j``: a fixed random unit direction u_j of the model's space scaled to the clipping norm,
the largest update clipping lets through. Its update is added to the round's sum of clipped
updates before the noise, as a real client's would be (the denominator, the expected count of
real clients, is not changed: the canaries are a probe, and they do bias the model by about
K q C / m; a check run, not a training run). After the last round, the cosine between the
model's total change and each u_j, against the cosines of directions never inserted, gives
the one-shot estimate (`mcfl.privacy.empirical.estimate_epsilon`). With noise it must lie
below the accountant's epsilon; with z = 0 it is large.

Directions are made from (seed, index) alone, leaf by leaf in the model's leaf order, so the
server's sum and the check after the run see the same u_j without storing K copies of the
model.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from mcfl.privacy.empirical import EmpiricalEstimate, cosines, estimate_epsilon

PyTree = Any
# Unseen canaries measured per inserted one (they cost no training; more of them pin the
# null distribution down), and at least this many.
UNSEEN_PER_INSERTED = 4
UNSEEN_AT_LEAST = 200


def canary_direction(seed: int, index, like: PyTree) -> PyTree:
    """Canary `index`'s unit direction, a tree shaped like `like` (one model, unstacked):
    independent standard normals per leaf from ``fold_in(key(seed), index)``, divided by
    their joint norm."""
    key = jax.random.fold_in(jax.random.key(seed), index)
    leaves, treedef = jax.tree.flatten(like)
    keys = jax.random.split(key, len(leaves))
    normals = [jax.random.normal(k, x.shape, jnp.float32) for k, x in zip(keys, leaves)]
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(n)) for n in normals))
    return jax.tree.unflatten(treedef, [n / norm for n in normals])


def inserted_sum(seed: int, count: int, rate: float, key: jax.Array, like: PyTree) -> PyTree:
    """The sum of the unit directions of the canaries that join this round (each with
    probability `rate`, drawn from `key`), accumulated one canary at a time (memory of one
    model, not `count`)."""
    joins = jax.random.uniform(key, (count,)) < rate
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), like)

    def add(j, total):
        direction = canary_direction(seed, j, like)
        return jax.tree.map(lambda t, d: t + jnp.where(joins[j], d, 0.0), total, direction)

    return jax.lax.fori_loop(0, count, add, zeros)


def estimate(initial: PyTree, final: PyTree, seed: int, count: int,
             delta: float) -> EmpiricalEstimate:
    """The one-shot empirical epsilon of a run whose global model went from `initial` to
    `final`: cosines of the change with the `count` inserted canaries (indices 0 .. count -
    1) against unseen ones (the indices after them)."""
    change = ravel_pytree(jax.tree.map(lambda a, b: b - a, initial, final))[0]
    unseen = max(UNSEEN_AT_LEAST, UNSEEN_PER_INSERTED * count)
    # one direction at a time (memory of one model, whatever the count)
    cosine = jax.jit(lambda j: cosines(change, ravel_pytree(
        canary_direction(seed, j, initial))[0][None])[0])

    def measured(indices) -> np.ndarray:
        return np.array([float(cosine(j)) for j in indices])

    return estimate_epsilon(measured(range(count)), measured(range(count, count + unseen)),
                            delta)
