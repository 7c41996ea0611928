"""The image models of recent clustered-FL workloads, each registered by name
(`mcfl.models.registry`); the text models are in `mcfl.models.zoo_text`.

Parameter counts on 32 x 32 x 3 images with 10 classes (pinned in tests/test_zoo.py):
- ``cnn-cifar`` (FedAvg's CIFAR-10 CNN, the TensorFlow tutorial's): 1,756,426 (1,068,298 on
  the paper's 24 x 24 crops: its "about 10^6").
- ``cnn-cifar-bn`` (the same with batch normalisation and dropout): 1,756,682.
- ``resnet18-gn`` (CIFAR ResNet-18 with GroupNorm): 11,173,962.

Every convolution takes `conv` as the papers' models do: "matmul" computes it as shifted
(strided) views and one matmul (`strided_conv_as_matmul`), "xla" with `flax.linen.Conv`; the
same parameters and results either way.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from mcfl.errors import ConfigError, choice_error
from mcfl.models.paper import conv_as_matmul, resolve_conv
from mcfl.models.registry import register
from mcfl.models.spec import FactoredLayer, HiddenUnits, ModelSpec, from_module

CONVS = ("auto", "matmul", "xla")  # as mcfl.models.paper.CONV_IMPLEMENTATIONS


def same_padding(size: int, window: int, stride: int) -> tuple[int, tuple[int, int]]:
    """(output size, (pad before, pad after)) of 'SAME' padding along one axis, as XLA's:
    ceil(size / stride) outputs, the odd padding row at the end (32, 3, 2 -> 16, (0, 1))."""
    out = -(-size // stride)
    total = max((out - 1) * stride + window - size, 0)
    return out, (total // 2, total - total // 2)


def _views(x: jax.Array, window: tuple[int, int], strides: tuple[int, int],
           pad_value: float = 0.0) -> list[jax.Array]:
    """The kh * kw strided views of the 'SAME'-padded images [B, H, W, C], in (i, j) order:
    view (i, j) at output (p, q) is the padded pixel (p * sh + i, q * sw + j)."""
    (kh, kw), (sh, sw) = window, strides
    (oh, ph), (ow, pw) = same_padding(x.shape[1], kh, sh), same_padding(x.shape[2], kw, sw)
    padded = jnp.pad(x, ((0, 0), ph, pw, (0, 0)), constant_values=pad_value)
    return [padded[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw, :]
            for i in range(kh) for j in range(kw)]


def strided_conv_as_matmul(x: jax.Array, kernel: jax.Array,
                           strides: tuple[int, int] = (1, 1)) -> jax.Array:
    """A 'SAME' convolution with `strides` of images [B, H, W, C_in] with `kernel` [kh, kw,
    C_in, C_out] as one matmul: the strided views of the padded images, concatenated on the
    channel axis in the kernel's (kh, kw, C_in) order, times the kernel reshaped to
    [kh * kw * C_in, C_out]. `mcfl.models.paper.conv_as_matmul` at any stride and kernel size
    (a ResNet's stride-2 3x3 and 1x1 projections), with the padding of `flax.linen.Conv`
    (checked in tests/test_zoo.py)."""
    kh, kw, c_in, c_out = kernel.shape
    if tuple(strides) == (1, 1) and kh % 2 and kw % 2:
        return conv_as_matmul(x, kernel)  # its backward pass is a convolution too
    patches = jnp.concatenate(_views(x, (kh, kw), strides), axis=-1)
    return patches @ kernel.reshape(kh * kw * c_in, c_out)


class StridedPatchConv(nn.Module):
    """`flax.linen.Conv` with 'SAME' padding computed by `strided_conv_as_matmul`; the same
    parameters ("kernel" [kh, kw, C_in, C_out], "bias") and initialisers."""

    features: int
    kernel_size: tuple[int, int] = (3, 3)
    strides: tuple[int, int] = (1, 1)
    use_bias: bool = True

    @nn.compact
    def __call__(self, x):
        kh, kw = self.kernel_size
        kernel = self.param("kernel", nn.initializers.lecun_normal(),
                            (kh, kw, x.shape[-1], self.features))
        y = strided_conv_as_matmul(x, kernel, self.strides)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros_init(), (self.features,))
        return y


def conv_layer(conv: str, features: int, kernel_size: tuple[int, int], stride: int = 1,
               use_bias: bool = True, name: Optional[str] = None) -> nn.Module:
    """A 'SAME' convolution computed as `conv` says ("matmul" or "xla")."""
    if conv == "xla":
        return nn.Conv(features, kernel_size, strides=(stride, stride), padding="SAME",
                       use_bias=use_bias, name=name)
    return StridedPatchConv(features, kernel_size, (stride, stride), use_bias, name=name)


def _max_3_stride_2(x: jax.Array, axis: int) -> jax.Array:
    """The maximum of 3 neighbours with stride 2 and 'SAME' padding along `axis` (1 or 2)."""
    out, pad = same_padding(x.shape[axis], 3, 2)
    widths = [(0, 0)] * x.ndim
    widths[axis] = pad
    padded = jnp.pad(x, widths, constant_values=-jnp.inf)
    views = [jax.lax.slice_in_dim(padded, i, i + (out - 1) * 2 + 1, 2, axis) for i in range(3)]
    return functools.reduce(jnp.maximum, views)


def max_pool_3x3_stride_2(x: jax.Array, conv: str = "matmul") -> jax.Array:
    """The TensorFlow tutorial's overlapping 3x3 max-pool with stride 2 and 'SAME' padding
    (32 -> 16): for "matmul" separably, the maximum of 3 strided rows and then of 3 strided
    columns of the -inf-padded images (elementwise maxima, which XLA:CPU runs fast; 6 views
    instead of 9, which halved a training step's time on CPU: its backward is the costly
    part), else `flax.linen.max_pool`."""
    if conv == "xla":
        return nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    return _max_3_stride_2(_max_3_stride_2(x, 1), 2)


class CifarCNN(nn.Module):
    """The CIFAR-10 CNN of FedAvg (McMahan et al., 2017, AISTATS, Sec. 3: "the TensorFlow
    tutorial [model]: two convolutional layers followed by two fully connected layers and then
    a linear transformation layer to produce logits, for a total of about 10^6 parameters").

    The tutorial's layers (cifar10.py): 5x5 'same' conv 3 -> 64, ReLU, 3x3 max-pool stride 2;
    5x5 conv 64 -> 64, ReLU, 3x3 max-pool stride 2; dense 384, ReLU; dense 192, ReLU; dense to
    the classes. Its local response normalisations are left out (they have no parameters, and
    FL re-implementations drop them); so is the input pipeline's random 24 x 24 crop: mcfl
    trains on whole images (32 x 32: 4,096 features into the first dense layer, 1.76 M
    parameters; 1.07 M on 24 x 24 crops). `trunk` and `head` split the model around its large
    first dense layer, as `mcfl.models.paper.ConvNet`'s do.
    """

    num_classes: int
    image_shape: tuple[int, int, int] = (32, 32, 3)
    features: tuple[int, int] = (64, 64)
    dense: tuple[int, int] = (384, 192)
    conv: str = "matmul"

    def setup(self):
        # Attribute names are the parameter names (Conv_0, Conv_1, Dense_0 .. Dense_2).
        self.Conv_0, self.Conv_1 = (conv_layer(self.conv, w, (5, 5)) for w in self.features)
        self.Dense_0, self.Dense_1 = (nn.Dense(w) for w in self.dense)
        self.Dense_2 = nn.Dense(self.num_classes)

    def trunk(self, x):
        x = x.reshape((x.shape[0],) + tuple(self.image_shape))
        for conv in (self.Conv_0, self.Conv_1):
            x = max_pool_3x3_stride_2(nn.relu(conv(x)), self.conv)
        return x.reshape((x.shape[0], -1))

    def head(self, z):
        return self.Dense_2(nn.relu(self.Dense_1(nn.relu(z))))

    def __call__(self, x):
        return self.head(self.Dense_0(self.trunk(x)))


class CifarCNNBN(nn.Module):
    """`CifarCNN` with batch normalisation after each convolution (before its ReLU) and
    dropout (rate 0.25) before the logits layer: a model with mutable state (``batch_stats``)
    and a train mode. BatchNorm uses PyTorch's defaults (momentum 0.1, i.e. flax's 0.9, and
    epsilon 1e-5), which FL codebases train with."""

    num_classes: int
    image_shape: tuple[int, int, int] = (32, 32, 3)
    features: tuple[int, int] = (64, 64)
    dense: tuple[int, int] = (384, 192)
    dropout: float = 0.25
    conv: str = "matmul"

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = x.reshape((x.shape[0],) + tuple(self.image_shape))
        for i, width in enumerate(self.features):
            x = conv_layer(self.conv, width, (5, 5), name=f"Conv_{i}")(x)
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                             name=f"BatchNorm_{i}")(x)
            x = max_pool_3x3_stride_2(nn.relu(x), self.conv)
        x = x.reshape((x.shape[0], -1))
        for i, width in enumerate(self.dense):
            x = nn.relu(nn.Dense(width, name=f"Dense_{i}")(x))
        x = nn.Dropout(self.dropout, deterministic=not train)(x)
        return nn.Dense(self.num_classes, name=f"Dense_{len(self.dense)}")(x)


class BasicBlock(nn.Module):
    """ResNet's basic block (He et al., 2016): two 3x3 convolutions, the first with `stride`,
    each followed by a GroupNorm, and a 1x1 projection (with its GroupNorm) on the shortcut
    when the shape changes. Convolutions have no bias: the normalisation's shift is one."""

    features: int
    stride: int = 1
    groups: int = 2
    conv: str = "matmul"

    @nn.compact
    def __call__(self, x):
        conv = functools.partial(conv_layer, self.conv, self.features, use_bias=False)
        norm = functools.partial(nn.GroupNorm, num_groups=self.groups, epsilon=1e-5)
        y = nn.relu(norm(name="GroupNorm_0")(conv((3, 3), self.stride, name="Conv_0")(x)))
        y = norm(name="GroupNorm_1")(conv((3, 3), name="Conv_1")(y))
        if self.stride != 1 or x.shape[-1] != self.features:
            x = norm(name="GroupNorm_2")(conv((1, 1), self.stride, name="Conv_2")(x))
        return nn.relu(x + y)


class ResNet18GN(nn.Module):
    """ResNet-18 (He et al., 2016) for 32 x 32 images, with GroupNorm in place of BatchNorm.

    The CIFAR stem (a 3x3 convolution with stride 1, no max-pool), four stages of two basic
    blocks with widths `width` x (1, 2, 4, 8) and strides (1, 2, 2, 2), global average pooling
    and one dense layer: 11,173,962 parameters at width 64 with 10 classes. BatchNorm's
    statistics are an average over whatever batches a client saw, which non-IID clients
    disagree on (Hsieh et al., 2020, "The Non-IID Data Quagmire", who propose GroupNorm for
    FL); GroupNorm has no statistics to keep. Two groups per layer, as in the CIFAR ResNet-18
    of Reddi et al. (2021, "Adaptive Federated Optimization"), which later FL work reuses.
    """

    num_classes: int
    image_shape: tuple[int, int, int] = (32, 32, 3)
    width: int = 64
    groups: int = 2
    blocks: tuple[int, ...] = (2, 2, 2, 2)
    conv: str = "matmul"

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0],) + tuple(self.image_shape))
        x = conv_layer(self.conv, self.width, (3, 3), use_bias=False, name="Conv_0")(x)
        x = nn.relu(nn.GroupNorm(num_groups=self.groups, epsilon=1e-5, name="GroupNorm_0")(x))
        for stage, count in enumerate(self.blocks):
            for b in range(count):
                stride = 2 if stage > 0 and b == 0 else 1
                x = BasicBlock(self.width * 2 ** stage, stride, self.groups, self.conv,
                               name=f"Block_{stage}_{b}")(x)
        return nn.Dense(self.num_classes, name="Dense_0")(jnp.mean(x, axis=(1, 2)))


def image_shape(feature_shape, model: str) -> tuple[int, int, int]:
    """Interpret a feature shape as (H, W, C): (32, 32, 3) as it is, (28, 28) -> 28x28x1, and
    flat features 3 * side^2 (3072) -> side x side x 3; anything else is a `ConfigError`."""
    shape = tuple(int(s) for s in feature_shape)
    if len(shape) == 3:
        return shape  # type: ignore[return-value]
    if len(shape) == 2:
        return (shape[0], shape[1], 1)
    side = math.isqrt(shape[0] // 3) if len(shape) == 1 else 0
    if len(shape) != 1 or 3 * side * side != shape[0] or side == 0:
        raise ConfigError(f"{model} needs images (H, W, C), e.g. (32, 32, 3), or 3 * side^2 "
                          f"flat RGB features such as 3072; the data's features are {shape}")
    return (side, side, 3)


def check_conv(conv: str) -> str:
    if conv not in CONVS:
        raise choice_error("conv", conv, CONVS)
    return resolve_conv(conv)


@register("cnn-cifar", "FedAvg's CIFAR-10 CNN (conv64-pool-conv64-pool-fc384-fc192)")
def cnn_cifar(feature_shape, num_classes, conv: str = "auto") -> ModelSpec:
    module = CifarCNN(num_classes, image_shape(feature_shape, "cnn-cifar"),
                      conv=check_conv(conv))
    side = tuple(same_padding(same_padding(s, 3, 2)[0], 3, 2)[0]  # after the two pools
                 for s in module.image_shape[:2])
    units = (HiddenUnits("Conv_0", "Conv_1", 2),
             HiddenUnits("Conv_1", "Dense_0", 2, side + (module.features[1], module.dense[0])),
             HiddenUnits("Dense_0", "Dense_1", 0), HiddenUnits("Dense_1", "Dense_2", 0))
    factored = FactoredLayer(
        "Dense_0",
        lambda params, x: module.apply({"params": params}, x.astype(jnp.float32),
                                       method=CifarCNN.trunk),
        lambda params, z: module.apply({"params": params}, z, method=CifarCNN.head),
    )
    return from_module(module, feature_shape, num_classes, "cnn-cifar", factored=factored,
                       hidden_units=units)


@register("cnn-cifar-bn", "cnn-cifar with batch normalisation and dropout 0.25 (train mode)")
def cnn_cifar_bn(feature_shape, num_classes, conv: str = "auto",
                 dropout: float = 0.25) -> ModelSpec:
    if not 0 <= dropout < 1:
        raise ConfigError(f"dropout must be in [0, 1), got {dropout}")
    module = CifarCNNBN(num_classes, image_shape(feature_shape, "cnn-cifar-bn"),
                        dropout=float(dropout), conv=check_conv(conv))
    return from_module(module, feature_shape, num_classes, "cnn-cifar-bn")


@register("resnet18-gn", "ResNet-18 for 32x32 images with GroupNorm (2 groups)")
def resnet18_gn(feature_shape, num_classes, conv: str = "auto", width: int = 64,
                groups: int = 2) -> ModelSpec:
    if int(width) < 1 or int(groups) < 1 or int(width) % int(groups):
        raise ConfigError(f"resnet18-gn needs a positive width divisible by groups, got width "
                          f"{width} and groups {groups}")
    module = ResNet18GN(num_classes, image_shape(feature_shape, "resnet18-gn"), int(width),
                        int(groups), conv=check_conv(conv))
    return from_module(module, feature_shape, num_classes, "resnet18-gn")
