"""The next-character models of recent clustered-FL workloads (LEAF Shakespeare), each
registered by name (`mcfl.models.registry`).

Inputs are [B, T] character indices stored as float32 (how mcfl keeps every dataset's rows);
the logits [B, num_classes] predict the character after the last one.

Parameter counts with LEAF's sizes (T = 80, an 80-letter vocabulary, 80 classes; pinned in
tests/test_zoo.py):
- ``char-lstm`` (LEAF's two-layer LSTM): 817,872.
- ``transformer-char`` (2 layers, width 64, 4 heads): 115,536.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from mcfl.errors import ConfigError
from mcfl.models.lstm_recurrence import lstm_recurrence
from mcfl.models.registry import register
from mcfl.models.spec import ModelSpec, from_module

LEAF_VOCABULARY = 80  # LEAF Shakespeare's letters (mcfl.data.leaf_strings.NUM_LETTERS)


class LSTMLayer(nn.Module):
    """One LSTM layer over time-major inputs [T, B, in] -> the hidden states [T, B, hidden]
    (time-major, so that stacked layers pass their states on without transposing them).

    Gates (i, f, g, o) as in TensorFlow's BasicLSTMCell (what LEAF uses), with its constant
    forget bias of 1 added to the f gate's pre-activation; the parameters are an input kernel
    [in, 4h], a recurrent kernel [h, 4h] and one bias [4h] (flax LSTMCell's initialisers). The
    input projections of all steps are one matmul outside the scan, which carries only the
    recurrent one; its backward pass forms the recurrent kernel's gradient as one matmul over
    all steps (`mcfl.models.lstm_recurrence`).
    """

    hidden: int
    forget_bias: float = 1.0

    @nn.compact
    def __call__(self, x):
        h = self.hidden
        projected = nn.Dense(4 * h, use_bias=False, name="input")(x)
        recurrent = self.param("recurrent_kernel", nn.initializers.orthogonal(), (h, 4 * h))
        bias = self.param("bias", nn.initializers.zeros_init(), (4 * h,))
        # the forget bias in the projections' dtype: a float32 constant would promote a
        # bfloat16 run's (--precision) recurrent matmuls back to float32
        forget = jnp.zeros(4 * h, projected.dtype).at[h:2 * h].set(self.forget_bias)
        projected = projected + bias + forget

        return lstm_recurrence(projected, recurrent)


class CharLSTM(nn.Module):
    """LEAF's Shakespeare model (Caldas et al., 2018, "LEAF: A Benchmark for Federated
    Settings"; the stacked LSTM of McMahan et al., 2017): an embedding of 8 per character, two
    LSTM layers of 256 units, and a dense layer from the last step's output to the classes."""

    num_classes: int
    vocab: int = LEAF_VOCABULARY
    embed: int = 8
    hidden: int = 256
    layers: int = 2

    @nn.compact
    def __call__(self, x):
        # time-major from the start: the indices [B, T] are the smallest tensor to transpose
        h = nn.Embed(self.vocab, self.embed, name="Embed_0")(x.astype(jnp.int32).T)
        for i in range(self.layers):
            h = LSTMLayer(self.hidden, name=f"LSTM_{i}")(h)
        return nn.Dense(self.num_classes, name="Dense_0")(h[-1])


class CharTransformer(nn.Module):
    """A small decoder-only transformer (Vaswani et al., 2017, with the pre-LayerNorm blocks
    of GPT-2, Radford et al., 2019) predicting the next character from the last position:
    learned token and position embeddings of `width`, `layers` blocks of causal self-attention
    (`heads` heads) and a GELU MLP of 4 x `width`, each around a residual, a final LayerNorm
    and a dense layer to the classes."""

    num_classes: int
    seq_len: int = 80
    vocab: int = LEAF_VOCABULARY
    width: int = 64
    heads: int = 4
    layers: int = 2

    @nn.compact
    def __call__(self, x):
        tokens = x.astype(jnp.int32)
        h = nn.Embed(self.vocab, self.width, name="Embed_0")(tokens)
        h = h + nn.Embed(self.seq_len, self.width, name="Position")(
            jnp.arange(tokens.shape[1]))
        mask = nn.make_causal_mask(tokens)
        for i in range(self.layers):
            y = nn.LayerNorm(name=f"LayerNorm_{2 * i}")(h)
            h = h + nn.MultiHeadDotProductAttention(
                self.heads, qkv_features=self.width, name=f"Attention_{i}")(y, y, mask=mask)
            y = nn.LayerNorm(name=f"LayerNorm_{2 * i + 1}")(h)
            y = nn.gelu(nn.Dense(4 * self.width, name=f"Dense_{2 * i}")(y))
            h = h + nn.Dense(self.width, name=f"Dense_{2 * i + 1}")(y)
        h = nn.LayerNorm(name=f"LayerNorm_{2 * self.layers}")(h[:, -1])
        return nn.Dense(self.num_classes, name="Head")(h)


def sequence_length(feature_shape, model: str) -> int:
    shape = tuple(int(s) for s in feature_shape)
    if len(shape) != 1 or shape[0] < 1:
        raise ConfigError(f"{model} needs 1-D rows of character indices, e.g. (80,) for LEAF "
                          f"Shakespeare; the data's features are {shape}")
    return shape[0]


def positive(model: str, **sizes) -> None:
    bad = {k: v for k, v in sizes.items() if int(v) < 1}
    if bad:
        raise ConfigError(f"{model}: sizes must be positive integers, got {bad}")


# The LSTM's width is `units`, not `hidden`: `make_model` hands the run's --hidden (the MLP's
# widths, (200, 200) by default) to every factory that takes an argument of that name.
@register("char-lstm", "LEAF's Shakespeare LSTM (embedding 8, two LSTM layers of 256)")
def char_lstm(feature_shape, num_classes, units: int = 256, embed: int = 8,
              vocab: int = LEAF_VOCABULARY) -> ModelSpec:
    sequence_length(feature_shape, "char-lstm")
    positive("char-lstm", units=units, embed=embed, vocab=vocab)
    module = CharLSTM(num_classes, int(vocab), int(embed), int(units))
    return from_module(module, feature_shape, num_classes, "char-lstm")


@register("transformer-char", "a 2-layer causal transformer (width 64, 4 heads) on characters")
def transformer_char(feature_shape, num_classes, width: int = 64, heads: int = 4,
                     layers: int = 2, vocab: int = LEAF_VOCABULARY) -> ModelSpec:
    length = sequence_length(feature_shape, "transformer-char")
    positive("transformer-char", width=width, heads=heads, layers=layers, vocab=vocab)
    if int(width) % int(heads):
        raise ConfigError(f"transformer-char: width {width} is not divisible by heads {heads}")
    module = CharTransformer(num_classes, length, int(vocab), int(width), int(heads),
                             int(layers))
    return from_module(module, feature_shape, num_classes, "transformer-char")
