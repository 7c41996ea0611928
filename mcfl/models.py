"""Flax models used by the papers, and a registry to build them by name.

Parameter counts (pinned in tests/test_models.py):
- MCLR on Synthetic (60 features, 10 classes): 610, as in FlexCFL Table II.
- MLP 784-200-200-10: 199,210.
- ``cnn-fmnist`` (FlexCFL's FashionMNIST CNN, conv32-pool-conv64-pool-fc1024): 3,274,634
  ("3.27 M", FlexCFL Table II).
- ``cnn-leaf`` (LEAF FEMNIST CNN, 62 classes): 6,603,710.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from mcfl.errors import ConfigError, choice_error


class MCLR(nn.Module):
    """Multinomial logistic regression: one dense layer on the flattened input."""

    num_classes: int

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(self.num_classes)(x)


class MLP(nn.Module):
    """Fully connected ReLU network with the given hidden widths."""

    hidden: Sequence[int]
    num_classes: int

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_classes)(x)


class ConvNet(nn.Module):
    """Two 5x5 'same' conv layers (each ReLU + 2x2 max-pool), one hidden dense layer.

    With ``features=(32, 64)`` and ``dense=1024`` this is FlexCFL's FashionMNIST CNN; with
    ``dense=2048`` and 62 classes it is the LEAF FEMNIST CNN (Caldas et al., 2018).
    """

    num_classes: int
    image_shape: tuple[int, int, int] = (28, 28, 1)
    features: tuple[int, int] = (32, 64)
    dense: int = 1024

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0],) + tuple(self.image_shape))
        for width in self.features:
            x = nn.relu(nn.Conv(width, kernel_size=(5, 5), padding="SAME")(x))
            x = nn.max_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(self.dense)(x))
        return nn.Dense(self.num_classes)(x)


MODEL_NAMES = ("mclr", "mlp", "cnn-fmnist", "cnn-leaf")


class ModelSpec(NamedTuple):
    """A model by name: `apply(params, x) -> logits` and `init(key) -> params`.

    `apply` is built once per model, so jitted functions that take it as a static argument
    compile once per model, not once per call.
    """

    name: str
    module: nn.Module
    feature_shape: tuple[int, ...]
    apply: Callable
    # For a ReLU stack of dense layers on the flattened input (mclr, mlp): the layers' parameter
    # names in order, which lets the engine train it in factored form (`mcfl.lowrank`).
    dense_layers: Optional[tuple[str, ...]] = None

    def init(self, key: jax.Array):
        dummy = jnp.zeros((1,) + tuple(self.feature_shape), jnp.float32)
        return self.module.init(key, dummy)["params"]


def _apply_fn(module: nn.Module) -> Callable:
    def apply(params, x):
        return module.apply({"params": params}, x.astype(jnp.float32))

    return apply


def _image_shape(feature_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """Interpret a feature shape as (H, W, C): 784 -> 28x28x1, (28, 28) -> 28x28x1."""
    shape = tuple(feature_shape)
    if len(shape) == 3:
        return shape  # type: ignore[return-value]
    if len(shape) == 2:
        return (shape[0], shape[1], 1)
    side = math.isqrt(shape[0])
    if side * side != shape[0]:
        raise ConfigError(
            f"a CNN needs square images; features of shape {shape} are not (use mclr or mlp)"
        )
    return (side, side, 1)


def make_model(
    name: str,
    feature_shape: tuple[int, ...],
    num_classes: int,
    hidden: Sequence[int] = (200, 200),
) -> ModelSpec:
    """Build a model by its registry name for inputs of `feature_shape`."""
    dense_layers = None
    if name == "mclr":
        module = MCLR(num_classes)
        dense_layers = ("Dense_0",)
    elif name == "mlp":
        if not hidden or any(int(h) < 1 for h in hidden):
            raise ConfigError(f"hidden widths must be positive integers, got {tuple(hidden)}")
        module = MLP(tuple(int(h) for h in hidden), num_classes)
        dense_layers = tuple(f"Dense_{i}" for i in range(len(hidden) + 1))
    elif name == "cnn-fmnist":
        module = ConvNet(num_classes, _image_shape(feature_shape), dense=1024)
    elif name == "cnn-leaf":
        module = ConvNet(num_classes, _image_shape(feature_shape), dense=2048)
    else:
        raise choice_error("model", name, MODEL_NAMES)
    return ModelSpec(name, module, tuple(feature_shape), _apply_fn(module), dense_layers)


def count_params(params) -> int:
    """Number of scalars in a parameter pytree."""
    return int(sum(leaf.size for leaf in jax.tree.leaves(params)))
