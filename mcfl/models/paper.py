"""The papers' models, each registered by name (`mcfl.models.registry`).

Parameter counts (pinned in tests/test_models.py):
- MCLR on Synthetic (60 features, 10 classes): 610, as in FlexCFL Table II.
- MLP 784-200-200-10: 199,210.
- ``cnn-fmnist`` (FlexCFL's FashionMNIST CNN, conv32-pool-conv64-pool-fc1024): 3,274,634
  ("3.27 M", FlexCFL Table II).
- ``cnn-leaf`` (LEAF FEMNIST CNN, 62 classes): 6,603,710.
- ``cnn-celeba`` (LEAF CelebA CNN without batch normalisation, 84 x 84 x 3, 2 classes): 30,946.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from mcfl.errors import ConfigError, choice_error
from mcfl.models.registry import register
from mcfl.models.spec import FactoredLayer, HiddenUnits, ModelSpec, from_module


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


def _same_patches(x: jax.Array, kh: int, kw: int) -> jax.Array:
    """[B, H, W, kh * kw * C]: the kh * kw shifted views of the zero-padded images [B, H, W, C]
    (odd kh, kw), concatenated on the channel axis in (kh, kw, C) order."""
    _, h, w, _ = x.shape
    padded = jnp.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
    return jnp.concatenate(
        [padded[:, i:i + h, j:j + w, :] for i in range(kh) for j in range(kw)], axis=-1)


@jax.custom_vjp
def conv_as_matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """A stride-1 'same' convolution of images [B, H, W, C_in] with `kernel` [kh, kw, C_in,
    C_out] (odd kh, kw) as one matmul: the kh * kw shifted views of the zero-padded images,
    concatenated on the channel axis in the kernel's (kh, kw, C_in) order, times the kernel
    reshaped to [kh * kw * C_in, C_out]. The same arithmetic as `flax.linen.Conv` (checked in
    tests/test_models.py), but XLA:CPU runs it as a plain matmul, also when vmapped over
    clients, where its convolution kernels are 7x slower than PyTorch's (BENCHMARKS.md).

    Its backward pass (`_conv_backward`) computes the input's gradient, when the layer has
    no more output than input channels, as a convolution of the output's gradient with the
    kernel rotated by 180 degrees (the transposed convolution,
    again one matmul), instead of autodiff's product with the kernel's transpose followed by
    summing kh * kw shifted views back into the image: the same FLOPs, but the product has
    the forward's fast shape and the views are gathered, not scattered (CIFAR CNN's second
    convolution on the EPYC, 2026-11-28: 9.6 ms for the product and about 11 ms of view sums
    a client-step, against about 8 ms in all this way)."""
    return _conv_forward(x, kernel)[0]


def _conv_forward(x, kernel):
    kh, kw, c_in, c_out = kernel.shape
    patches = _same_patches(x, kh, kw)
    return patches @ kernel.reshape(kh * kw * c_in, c_out), (patches, kernel)


def _conv_backward(saved, d_y):
    patches, kernel = saved
    kh, kw, c_in, c_out = kernel.shape
    rows = math.prod(d_y.shape[:-1])
    d_kernel = patches.reshape(rows, kh * kw * c_in).T @ d_y.reshape(rows, c_out)
    if c_out > c_in:
        # more output than input channels (the Fashion-MNIST CNN's 32 -> 64): the views of dy
        # would be wider than the patches, so autodiff's way is the cheaper one: the patches'
        # gradient, summed back into the image (the transpose of taking the views)
        d_patches = (d_y.reshape(rows, c_out) @ kernel.reshape(kh * kw * c_in, c_out).T)
        image = jax.ShapeDtypeStruct(patches.shape[:-1] + (c_in,), patches.dtype)
        sum_views = jax.linear_transpose(lambda x: _same_patches(x, kh, kw), image)
        (d_x,) = sum_views(d_patches.reshape(patches.shape))
        return d_x, d_kernel.reshape(kernel.shape)
    # dx[q, c] = sum_{i, j, o} dy[q - (i, j) + centre, o] K[i, j, c, o]: a 'same' convolution
    # of dy with K[kh - 1 - i, kw - 1 - j, o, c], contracted over (view, o) without
    # materialising the swapped kernel (that transpose cost a third of the product: ResNet's
    # 512-channel layers, 14.7 against 10.9 ms on the EPYC)
    views = _same_patches(d_y, kh, kw).reshape(rows, kh * kw, c_out)
    rotated = kernel[::-1, ::-1].reshape(kh * kw, c_in, c_out)
    d_x = jax.lax.dot_general(views, rotated, (((1, 2), (0, 2)), ((), ())))
    return d_x.reshape(d_y.shape[:-1] + (c_in,)), d_kernel.reshape(kernel.shape)


conv_as_matmul.defvjp(_conv_forward, _conv_backward)


class PatchConv(nn.Module):
    """`flax.linen.Conv` (stride 1, 'same' padding, odd kernel) computed by `conv_as_matmul`;
    the same parameters ("kernel" [kh, kw, C_in, C_out], "bias") and initialisers."""

    features: int
    kernel_size: tuple[int, int] = (5, 5)

    @nn.compact
    def __call__(self, x):
        kh, kw = self.kernel_size
        kernel = self.param("kernel", nn.initializers.lecun_normal(),
                            (kh, kw, x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
        return conv_as_matmul(x, kernel) + bias


def max_pool_2x2(x: jax.Array) -> jax.Array:
    """2x2 max-pool with stride 2 of [B, H, W, C] (H, W even) as a reshape and a max."""
    b, h, w, c = x.shape
    return jnp.max(x.reshape(b, h // 2, 2, w // 2, 2, c), axis=(2, 4))


def max_pool_2x2_same(x: jax.Array) -> jax.Array:
    """2x2 max-pool with stride 2 and 'SAME' padding of [B, H, W, C]: an odd side gets one row
    or column of -inf at its end first (as ``flax.linen.max_pool(..., padding="SAME")``), so
    21 -> 11."""
    _, h, w, _ = x.shape
    if h % 2 or w % 2:
        x = jnp.pad(x, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), constant_values=-jnp.inf)
    return max_pool_2x2(x)


CONV_IMPLEMENTATIONS = ("auto", "matmul", "xla")  # as config.CONVS


def resolve_conv(conv: str, backend: Optional[str] = None) -> str:
    """"auto": `conv_as_matmul` on CPU and GPU, XLA's convolution on TPU. On an H200 the
    FashionMNIST CNN's round of 200 clients took 0.055 s as matmuls and 0.094 s with cuDNN's
    convolutions (at 3.7 GB of device memory against 2.3 GB; `mcfl bench --suite accelerator`,
    BENCHMARKS.md); on a TPU neither has been measured, and XLA's own is kept."""
    if conv != "auto":
        return conv
    return "xla" if (backend or jax.default_backend()) == "tpu" else "matmul"


class ConvNet(nn.Module):
    """Two 5x5 'same' conv layers (each ReLU + 2x2 max-pool), one hidden dense layer.

    With ``features=(32, 64)`` and ``dense=1024`` this is FlexCFL's FashionMNIST CNN; with
    ``dense=2048`` and 62 classes it is the LEAF FEMNIST CNN (Caldas et al., 2018). `conv`
    "matmul" computes the convolutions and pools as matmuls and reshapes, "xla" with
    `flax.linen.Conv` and `max_pool`: the same parameters and results either way.

    Besides ``__call__``, `trunk` (image -> the hidden dense layer's inputs) and `head` (its
    pre-activations -> logits) let the engine keep that layer's kernel change in factored form.
    """

    num_classes: int
    image_shape: tuple[int, int, int] = (28, 28, 1)
    features: tuple[int, int] = (32, 64)
    dense: int = 1024
    conv: str = "matmul"

    def setup(self):
        # Attribute names are the parameter names (Conv_0, Conv_1, Dense_0, Dense_1).
        if self.conv == "matmul":
            self.Conv_0, self.Conv_1 = (PatchConv(w, (5, 5)) for w in self.features)
        else:
            self.Conv_0, self.Conv_1 = (nn.Conv(w, kernel_size=(5, 5), padding="SAME")
                                        for w in self.features)
        self.Dense_0 = nn.Dense(self.dense)
        self.Dense_1 = nn.Dense(self.num_classes)

    def trunk(self, x):
        x = x.reshape((x.shape[0],) + tuple(self.image_shape))
        for conv in (self.Conv_0, self.Conv_1):
            x = nn.relu(conv(x))
            if self.conv == "matmul":
                x = max_pool_2x2(x)
            else:
                x = nn.max_pool(x, window_shape=(2, 2), strides=(2, 2))
        return x.reshape((x.shape[0], -1))

    def head(self, z):
        return self.Dense_1(nn.relu(z))

    def __call__(self, x):
        return self.head(self.Dense_0(self.trunk(x)))


class CelebaConvNet(nn.Module):
    """LEAF's CelebA CNN (Caldas et al., 2018): four blocks of a 3x3 'same' convolution with 32
    filters, a 2x2 max-pool ('SAME': 84 -> 42 -> 21 -> 11 -> 6) and ReLU, then one dense layer.

    LEAF's blocks also hold a batch normalisation that it runs in training mode at test time
    too, so a client's test accuracy would depend on how its test rows are batched; mcfl leaves
    it out. `conv` as in `ConvNet`.
    """

    num_classes: int
    image_shape: tuple[int, int, int] = (84, 84, 3)
    width: int = 32
    blocks: int = 4
    conv: str = "matmul"

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0],) + tuple(self.image_shape))
        for i in range(self.blocks):
            if self.conv == "matmul":
                x = max_pool_2x2_same(PatchConv(self.width, (3, 3), name=f"Conv_{i}")(x))
            else:
                x = nn.Conv(self.width, kernel_size=(3, 3), padding="SAME", name=f"Conv_{i}")(x)
                x = nn.max_pool(x, window_shape=(2, 2), strides=(2, 2), padding="SAME")
            x = nn.relu(x)
        return nn.Dense(self.num_classes, name="Dense_0")(x.reshape((x.shape[0], -1)))


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


def _check_conv(conv: str) -> str:
    if conv not in CONV_IMPLEMENTATIONS:
        raise choice_error("conv", conv, CONV_IMPLEMENTATIONS)
    return resolve_conv(conv)


@register("mclr", "multinomial logistic regression (one dense layer)")
def mclr(feature_shape, num_classes) -> ModelSpec:
    return from_module(MCLR(num_classes), feature_shape, num_classes, "mclr",
                       dense_layers=("Dense_0",))


@register("mlp", "ReLU MLP, widths from --hidden")
def mlp(feature_shape, num_classes, hidden: Sequence[int] = (200, 200)) -> ModelSpec:
    if not hidden or any(int(h) < 1 for h in hidden):
        raise ConfigError(f"hidden widths must be positive integers, got {tuple(hidden)}")
    module = MLP(tuple(int(h) for h in hidden), num_classes)
    units = tuple(HiddenUnits(f"Dense_{i}", f"Dense_{i + 1}", 0) for i in range(len(hidden)))
    return from_module(module, feature_shape, num_classes, "mlp",
                       dense_layers=tuple(f"Dense_{i}" for i in range(len(hidden) + 1)),
                       hidden_units=units)


def _conv_net(name: str, dense: int, feature_shape, num_classes, conv: str) -> ModelSpec:
    module = ConvNet(num_classes, _image_shape(feature_shape), dense=dense,
                     conv=_check_conv(conv))
    side = (module.image_shape[0] // 4, module.image_shape[1] // 4)  # after two pools
    units = (HiddenUnits("Conv_0", "Conv_1", 2),
             HiddenUnits("Conv_1", "Dense_0", 2, side + (module.features[1], module.dense)),
             HiddenUnits("Dense_0", "Dense_1", 0))
    factored = FactoredLayer(
        "Dense_0",
        lambda params, x: module.apply({"params": params}, x.astype(jnp.float32),
                                       method=ConvNet.trunk),
        lambda params, z: module.apply({"params": params}, z, method=ConvNet.head),
    )
    return from_module(module, feature_shape, num_classes, name, factored=factored,
                       hidden_units=units)


@register("cnn-fmnist", "FlexCFL's FashionMNIST CNN (conv32-pool-conv64-pool-fc1024)")
def cnn_fmnist(feature_shape, num_classes, conv: str = "auto") -> ModelSpec:
    return _conv_net("cnn-fmnist", 1024, feature_shape, num_classes, conv)


@register("cnn-leaf", "LEAF's FEMNIST CNN (conv32-pool-conv64-pool-fc2048)")
def cnn_leaf(feature_shape, num_classes, conv: str = "auto") -> ModelSpec:
    return _conv_net("cnn-leaf", 2048, feature_shape, num_classes, conv)


@register("cnn-celeba", "LEAF's CelebA CNN without its batch normalisation")
def cnn_celeba(feature_shape, num_classes, conv: str = "auto") -> ModelSpec:
    module = CelebaConvNet(num_classes, _image_shape(feature_shape), conv=_check_conv(conv))
    side = tuple(module.image_shape[:2])
    for _ in range(module.blocks):
        side = tuple(-(-s // 2) for s in side)  # 'SAME' pools round up
    units = tuple(HiddenUnits(f"Conv_{i}", f"Conv_{i + 1}", 2)
                  for i in range(module.blocks - 1))
    units += (HiddenUnits(f"Conv_{module.blocks - 1}", "Dense_0", 2,
                          side + (module.width, num_classes)),)
    return from_module(module, feature_shape, num_classes, "cnn-celeba", hidden_units=units)


def count_params(params) -> int:
    """Number of scalars in a parameter pytree."""
    return int(sum(leaf.size for leaf in jax.tree.leaves(params)))
