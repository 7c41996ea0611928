"""Matched averaging's alignment step (FedMA, Wang et al., 2020; PFNM, Yurochkin et al., 2019):
permute a model's hidden units to line up with a reference model's before the two are averaged.

Hidden units have no fixed order: permuting a layer's units and the next layer's inputs the same
way gives the same function, so averaging two models unit by unit can average unrelated units.
Layer by layer from the input (`ModelSpec.hidden_units`), each unit of the model is described by
its incoming weights and bias (a dense kernel's column, a conv kernel's output channel); the
Hungarian assignment (scipy's ``linear_sum_assignment``, through `jax.pure_callback`) pairs
them with the reference's units at the least total squared distance; the model's layer and the
next layer's inputs are permuted accordingly before the next layer is matched.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mcfl.clustering import squared_distances
from mcfl.models import HiddenUnits


def _assignment(cost: np.ndarray) -> np.ndarray:
    """perm[j] = the row matched with column j, for a square cost matrix (host side)."""
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(np.asarray(cost, np.float64))
    perm = np.empty(len(cols), np.int32)
    perm[cols] = rows
    return perm


def matching(cost: jax.Array) -> jax.Array:
    """[U] the unit of the model matched with each reference unit, minimising the summed
    cost [U, U] (model units as rows); jittable and vmappable (one solve per matrix)."""
    out = jax.ShapeDtypeStruct(cost.shape[-1:], jnp.int32)
    return jax.pure_callback(_assignment, out, cost, vmap_method="sequential")


def unit_vectors(params, name: str) -> jax.Array:
    """[U, D] each unit of layer `name`: its incoming weights and its bias."""
    kernel, bias = params[name]["kernel"], params[name]["bias"]
    units = kernel.shape[-1]
    incoming = jnp.moveaxis(kernel, -1, 0).reshape(units, -1)
    return jnp.concatenate([incoming, bias[:, None]], axis=1)


def permute_units(params, layer: HiddenUnits, perm: jax.Array):
    """`params` with the units of `layer` reordered by `perm` (unit j <- unit perm[j]) and the
    next layer's inputs reordered the same way: the same function."""
    out = dict(params)
    own = params[layer.name]
    out[layer.name] = {**own, "kernel": own["kernel"][..., perm], "bias": own["bias"][perm]}
    reader = params[layer.reader]["kernel"]
    shaped = reader if layer.shape is None else reader.reshape(layer.shape)
    permuted = jnp.take(shaped, perm, axis=layer.axis).reshape(reader.shape)
    out[layer.reader] = {**params[layer.reader], "kernel": permuted}
    return out


def align(params, reference, hidden: Sequence[HiddenUnits]):
    """`params` with every hidden layer's units permuted to match `reference`'s, layer by
    layer from the input (each layer matched after the previous one's permutation has
    reordered its inputs)."""
    for layer in hidden:
        cost = squared_distances(unit_vectors(params, layer.name),
                                 unit_vectors(reference, layer.name))
        params = permute_units(params, layer, matching(cost))
    return params
