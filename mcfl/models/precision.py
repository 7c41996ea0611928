"""`--precision bfloat16`: a model that computes in bfloat16 on float32 master weights.

`with_precision` wraps a `ModelSpec`'s ``apply`` (and its training-step forward): each call
casts the model's parameters to bfloat16 (compute copies), casts the floating inputs of every
matmul layer (flax's ``Dense``, ``DenseGeneral``, ``Conv``, ``ConvTranspose``, ``ConvLocal``,
``Einsum`` and mcfl's patch convolutions) to bfloat16, so their matmuls, convolutions and the
activations after them are bfloat16, and casts what comes out back to float32. The softmax
cross-entropy, the gradients (autodiff of the cast gives them in float32, with respect to the
float32 parameters), the optimizer, the clients' kept state and every aggregation and
clustering step therefore stay float32.

Why at the matmul layers and not the model's input: mcfl keeps every dataset's rows as float32,
text ones as character indices, which an ``Embed`` reads; bfloat16 holds integers exactly
only up to 256. A layer a model computes itself (``x @ self.param(...)``) computes in the
dtype its inputs promote to: bfloat16 after a bfloat16 layer.

Mutable collections (BatchNorm's running statistics) stay float32: an exponential average
with momentum 0.99 kept in bfloat16 (8 bits of mantissa) would stop moving.

The factored fast paths (`mcfl.engine.lowrank`, `mcfl.engine.local_train_factored`) compute
their products from the parameters outside ``apply`` and keep float32 histories; they are
turned off rather than taught bfloat16, so a bfloat16 run trains on the per-client path, where
every product goes through ``apply``. The convolution-as-matmul path (``--conv matmul``) is an
interceptor inside ``apply`` and computes in bfloat16 like ``nn.Conv``.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from mcfl.errors import choice_error
from mcfl.models.paper import PatchConv
from mcfl.models.spec import ModelSpec, PyTree, trainable_part, with_trainable_part
from mcfl.models.zoo import StridedPatchConv

PRECISIONS = ("float32", "bfloat16")  # as mcfl.config.PRECISIONS

_MATMUL_LAYERS = (nn.Dense, nn.DenseGeneral, nn.Conv, nn.ConvTranspose, nn.ConvLocal,
                  nn.Einsum, PatchConv, StridedPatchConv)


def cast_floats(tree: PyTree, dtype) -> PyTree:
    """`tree` with its floating leaves cast to `dtype` (integer and other leaves as they are)."""
    def cast(x):
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(dtype)
        return x

    return jax.tree.map(cast, tree)


def _bfloat16_layer_inputs(next_fun, args, kwargs, context):
    """`flax.linen.intercept_methods` interceptor: a matmul layer's floating inputs in
    bfloat16. Installed outside the model's own interceptors (the `--conv matmul` one), so it
    runs first and they see bfloat16 inputs."""
    if isinstance(context.module, _MATMUL_LAYERS) and context.method_name == "__call__":
        args = cast_floats(args, jnp.bfloat16)
        kwargs = cast_floats(kwargs, jnp.bfloat16)
    return next_fun(*args, **kwargs)


def _in_bfloat16(fn: Callable, collections: tuple[str, ...]) -> Callable:
    """``fn(model, x, *rest)`` computed in bfloat16: the model's params cast (its collections
    not), the matmul layers' inputs cast, every floating output back in float32."""
    def wrapped(model, x, *rest):
        params = cast_floats(trainable_part(model, collections), jnp.bfloat16)
        with nn.intercept_methods(_bfloat16_layer_inputs):
            out = fn(with_trainable_part(model, params, collections), x, *rest)
        return cast_floats(out, jnp.float32)

    return wrapped


def with_precision(spec: ModelSpec, precision: str = "float32") -> ModelSpec:
    """`spec` computing in `precision`: as it is for "float32"; for "bfloat16", its forward
    (evaluation and training step) in bfloat16 on float32 parameters, and the factored fast
    paths off (the module docstring says why)."""
    if precision not in PRECISIONS:
        raise choice_error("precision", precision, PRECISIONS)
    if precision == "float32":
        return spec
    train_apply = spec.train_apply
    return spec._replace(
        apply=_in_bfloat16(spec.apply, spec.collections),
        train_apply=None if train_apply is None else _in_bfloat16(train_apply, spec.collections),
        dense_layers=None, factored=None)
