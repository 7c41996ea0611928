"""Fast paths by structure, not by name: what the engine's fast paths need, found in any flax
module where it is exact.

- A ReLU stack of ``nn.Dense`` layers on the flattened input (the user's own MLP): its layers
  in order (`ModelSpec.dense_layers`), which lets local training keep the weight changes
  factored (`mcfl.engine.lowrank`). Found from the parameter shapes (a chain of kernels from
  the input width to the classes) and confirmed numerically: the module must equal the ReLU
  stack of its own layers on random inputs for two random initialisations.
- One large ``nn.Dense`` layer after a trunk (a CNN's first dense layer: at least a third of
  the parameters, a top-level layer called once on [B, features]): the model seen as
  ``head(trunk(x) @ K + b)`` (`ModelSpec.factored`), which lets local training keep K's
  change as factors (`mcfl.engine.local_train_factored`). `trunk` runs the module until
  that layer's call and returns its input; `head` runs it with the layer's output replaced
  (the trunk computed there is unused, and XLA drops it). Confirmed numerically as above.
- ``nn.Conv`` layers with 'SAME' padding, no dilation and one feature group: computed as
  shifted views and one matmul (`conv_as_matmul`, at any stride) where `--conv` resolves to
  "matmul" (CPU, where XLA's convolutions are ~30x slower), by intercepting the layer's call
  (`flax.linen.intercept_methods`); the parameters are the layer's own, created with its
  initialisers, so values and gradients are those of ``nn.Conv`` (tests/test_user_models.py).
- ``nn.Dense`` calls on at most 32 rows, on CPU: the kernel gradient as a sum of the rows' outer
  products (`mcfl.models.row_outer`), which XLA:CPU runs 3-5x faster than a batched product of
  one small matrix per client; same values to float32 rounding.

``fast_paths="off"`` leaves a module on the generic path (vmapped `jax.grad` of its apply).
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mcfl.models.paper import resolve_conv
from mcfl.models.row_outer import row_outer_dense
from mcfl.models.spec import FactoredLayer, ModelSpec, PyTree
from mcfl.models.zoo import strided_conv_as_matmul

FAST_PATHS = ("auto", "off")  # as mcfl.config.FAST_PATHS


def dense_chain(params: PyTree, in_width: int, num_classes: int) -> Optional[tuple[str, ...]]:
    """The names of a chain of dense layers (``{"kernel": [a, b], "bias": [b]}`` each) from
    `in_width` to `num_classes` that uses every parameter, or None."""
    layers = {}
    for name, leaves in params.items():
        if not isinstance(leaves, dict) or set(leaves) != {"kernel", "bias"}:
            return None
        kernel, bias = leaves["kernel"], leaves["bias"]
        if len(kernel.shape) != 2 or tuple(bias.shape) != (kernel.shape[1],):
            return None
        layers[name] = tuple(kernel.shape)
    chain, width, left = [], in_width, dict(layers)
    while left:
        nxt = [name for name, (a, _) in left.items() if a == width]
        if len(nxt) != 1:
            return None
        chain.append(nxt[0])
        width = left.pop(nxt[0])[1]
    return tuple(chain) if chain and width == num_classes else None


def relu_stack(params: PyTree, layers: tuple[str, ...], x: jax.Array) -> jax.Array:
    """The function the low-rank path trains: dense layers with ReLU between them."""
    h = x.reshape((x.shape[0], -1))
    for i, name in enumerate(layers):
        h = h @ params[name]["kernel"] + params[name]["bias"]
        if i < len(layers) - 1:
            h = jax.nn.relu(h)
    return h


def _is_relu_stack(spec: ModelSpec, layers: tuple[str, ...]) -> bool:
    """Whether `spec` computes `relu_stack` of its layers (two random inits, 8 random rows;
    the biases are randomised too, as zero biases would hide an affine difference)."""
    for seed in (0, 1):
        key_init, key_x, key_b = jax.random.split(jax.random.key(seed), 3)
        params = spec.init(key_init)
        params = {name: {**params[name], "bias": jax.random.normal(
            jax.random.fold_in(key_b, i), params[name]["bias"].shape)}
            for i, name in enumerate(layers)}
        x = jax.random.normal(key_x, (8,) + tuple(spec.feature_shape))
        if not np.allclose(spec.apply(params, x), relu_stack(params, layers, x), rtol=1e-4,
                           atol=1e-4):
            return False
    return True


def find_dense_stack(spec: ModelSpec) -> Optional[tuple[str, ...]]:
    """The layers of `spec` in order when it is a ReLU stack of dense layers, else None."""
    if spec.collections or spec.takes_train:
        return None
    shapes = jax.eval_shape(spec.init, jax.random.key(0))
    layers = dense_chain(shapes, math.prod(spec.feature_shape), _num_classes(spec, shapes))
    if layers is None or not _is_relu_stack(spec, layers):
        return None
    return layers


def _num_classes(spec: ModelSpec, shapes: PyTree) -> int:
    dummy = jax.ShapeDtypeStruct((1,) + tuple(spec.feature_shape), jnp.float32)
    return int(jax.eval_shape(spec.apply, shapes, dummy).shape[-1])


class _LayerInput(Exception):
    """Carries the input of the intercepted layer out of the module (`trunk`)."""

    def __init__(self, value):
        super().__init__()
        self.value = value


def _is_call_of(context, name: str) -> bool:
    return (type(context.module) is nn.Dense and context.method_name == "__call__"
            and tuple(context.module.scope.path) == (name,))


def factored_layer(spec: ModelSpec, name: str) -> FactoredLayer:
    """`spec` as ``head(trunk(x) @ K + b)`` around its top-level dense layer `name`."""
    apply = spec.apply

    def trunk(params, x):
        def stop_at_layer(next_fun, args, kwargs, context):
            if _is_call_of(context, name):
                raise _LayerInput(args[0])
            return next_fun(*args, **kwargs)

        try:
            with nn.intercept_methods(stop_at_layer):
                apply(params, x)
        except _LayerInput as layer_input:
            return layer_input.value
        raise ValueError(f"layer {name!r} was not called")

    def head(params, z):
        def replace_output(next_fun, args, kwargs, context):
            if _is_call_of(context, name):
                return z
            return next_fun(*args, **kwargs)

        # the trunk is traced here too, but nothing reads it: XLA removes it
        dummy = jnp.zeros((z.shape[0],) + tuple(spec.feature_shape), jnp.float32)
        with nn.intercept_methods(replace_output):
            return apply(params, dummy)

    return FactoredLayer(name, trunk, head)


def find_factored_layer(spec: ModelSpec) -> Optional[FactoredLayer]:
    """The factored form of `spec` around its largest dense layer, when that layer holds at
    least a third of the parameters, is called once on a [B, features] input, and the form
    equals the module on random inputs; else None."""
    if spec.collections or spec.takes_train:
        return None
    shapes = jax.eval_shape(spec.init, jax.random.key(0))
    dense = {name: leaves["kernel"].shape for name, leaves in shapes.items()
             if isinstance(leaves, dict) and set(leaves) == {"kernel", "bias"}
             and len(leaves["kernel"].shape) == 2}
    if not dense:
        return None
    name = max(dense, key=lambda n: math.prod(dense[n]))
    total = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))
    if 3 * math.prod(dense[name]) < total:
        return None
    calls = []

    def count(next_fun, args, kwargs, context):
        if _is_call_of(context, name):
            calls.append(tuple(args[0].shape))
        return next_fun(*args, **kwargs)

    dummy = jax.ShapeDtypeStruct((2,) + tuple(spec.feature_shape), jnp.float32)
    with nn.intercept_methods(count):
        jax.eval_shape(spec.apply, shapes, dummy)
    if calls != [(2, dense[name][0])]:
        return None
    layer = factored_layer(spec, name)
    for seed in (0, 1):
        key_init, key_x = jax.random.split(jax.random.key(seed))
        params = spec.init(key_init)
        x = jax.random.normal(key_x, (4,) + tuple(spec.feature_shape))
        h = layer.trunk(params, x)
        z = h @ params[name]["kernel"] + params[name]["bias"]
        if not np.allclose(layer.head(params, z), spec.apply(params, x), rtol=1e-4, atol=1e-4):
            return None
    return layer


def _matmul_conv(next_fun, args, kwargs, context):
    """`flax.linen.intercept_methods` interceptor: an eligible ``nn.Conv`` call computed as
    `strided_conv_as_matmul`, with the layer's own parameters."""
    conv = context.module
    if not (type(conv) is nn.Conv and context.method_name == "__call__" and len(args) == 1
            and not kwargs):
        return next_fun(*args, **kwargs)
    x = args[0]
    kernel_size = tuple(conv.kernel_size)
    strides = conv.strides or 1
    strides = (strides,) * 2 if isinstance(strides, int) else tuple(strides)
    dilations = [d or 1 for d in (conv.input_dilation, conv.kernel_dilation)]
    eligible = (x.ndim == 4 and len(kernel_size) == 2 and len(strides) == 2
                and conv.padding == "SAME" and all(d == 1 or d == (1, 1) for d in dilations)
                and conv.feature_group_count == 1 and conv.mask is None)
    if not eligible:
        return next_fun(*args, **kwargs)
    kernel = conv.param("kernel", conv.kernel_init, kernel_size + (x.shape[-1], conv.features),
                        conv.param_dtype)
    y = strided_conv_as_matmul(x, kernel.astype(x.dtype), strides)
    if conv.use_bias:
        y = y + conv.param("bias", conv.bias_init, (conv.features,), conv.param_dtype)
    return y


def _uses(spec: ModelSpec, layer: type) -> bool:
    """Whether the module calls a `layer` (``nn.Conv``, ``nn.Dense``) itself, not a subclass."""
    seen = []

    def spy(next_fun, args, kwargs, context):
        if type(context.module) is layer:
            seen.append(True)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(spy):
        jax.eval_shape(spec.init, jax.random.key(0))
    return bool(seen)


def uses_conv(spec: ModelSpec) -> bool:
    """Whether the model calls ``flax.linen.Conv`` (what ``--conv`` computes as matmuls)."""
    return _uses(spec, nn.Conv)


def _intercepted(fn, interceptors: tuple):
    def wrapped(*args):
        with contextlib.ExitStack() as stack:
            for interceptor in interceptors:
                stack.enter_context(nn.intercept_methods(interceptor))
            return fn(*args)

    return wrapped


def with_fast_paths(spec: ModelSpec, fast_paths: str = "auto", conv: str = "auto",
                    backend: Optional[str] = None) -> ModelSpec:
    """`spec` with the fast paths its structure allows (`fast_paths` "auto"), or none of them
    ("off": the generic path, also for the papers' models' factored layers)."""
    if fast_paths == "off":
        return spec._replace(dense_layers=None, factored=None)
    if spec.dense_layers is None and spec.factored is None:
        layers = find_dense_stack(spec)
        if layers is not None:
            return spec._replace(dense_layers=layers)
    interceptors = ()
    if resolve_conv(conv, backend) == "matmul" and _uses(spec, nn.Conv):
        interceptors += (_matmul_conv,)
    if (backend or jax.default_backend()) == "cpu" and _uses(spec, nn.Dense):
        interceptors += (row_outer_dense,)
    if interceptors:
        spec = spec._replace(
            apply=_intercepted(spec.apply, interceptors),
            train_apply=None if spec.train_apply is None else _intercepted(spec.train_apply,
                                                                           interceptors))
    if spec.dense_layers is None and spec.factored is None:
        spec = spec._replace(factored=find_factored_layer(spec))
    return spec
