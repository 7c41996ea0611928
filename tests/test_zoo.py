"""The model zoo (`mcfl.models.zoo`, `mcfl.models.zoo_text`): parameter counts, the matmul
convolutions against flax's, and what each model's output depends on. Tiny sizes: fast."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mcfl.algorithms.clustered.matching import permute_units
from mcfl.errors import ConfigError
from mcfl.models import conv_as_matmul, count_params, make_model
from mcfl.models.zoo import max_pool_3x3_stride_2, strided_conv_as_matmul


def trainable(spec, variables):
    return variables["params"] if spec.collections else variables


@pytest.mark.parametrize(
    "name, features, classes, expected",
    [
        # conv 5*5*3*64 + 64 = 4,864; conv 5*5*64*64 + 64 = 102,464; 32 -> 16 -> 8 after the
        # pools, 8*8*64 = 4,096 -> 384: 1,573,248; 384*192 + 192 = 73,920; 192*10 + 10 = 1,930
        ("cnn-cifar", (32, 32, 3), 10, 1_756_426),
        # the paper's 24 x 24 crops: 6*6*64 = 2,304 -> 384 is 885,120 ("about 10^6")
        ("cnn-cifar", (24, 24, 3), 10, 1_068_298),
        ("cnn-cifar", (3072,), 10, 1_756_426),
        # + BatchNorm scale and bias of 64 + 64 channels (batch_stats are not parameters)
        ("cnn-cifar-bn", (32, 32, 3), 10, 1_756_682),
        # stem 3*3*3*64 + GN 128 = 1,856; stage 1: 2 * (2 * 36,864 + 256) = 147,968;
        # stage 2: (73,728 + 147,456 + 512 + 1x1 8,192 + 256) + (2 * 147,456 + 512) = 525,568;
        # stage 3: (294,912 + 589,824 + 1,024 + 32,768 + 512) + (2 * 589,824 + 1,024)
        # = 2,099,712; stage 4: (1,179,648 + 2,359,296 + 2,048 + 131,072 + 1,024)
        # + (2 * 2,359,296 + 2,048) = 8,393,728; dense 512*10 + 10 = 5,130
        ("resnet18-gn", (32, 32, 3), 10, 11_173_962),
        # embedding 80*8 = 640; LSTM 1: (8 + 256) * 1,024 + 1,024 = 271,360; LSTM 2:
        # (256 + 256) * 1,024 + 1,024 = 525,312; dense 256*80 + 80 = 20,560
        ("char-lstm", (80,), 80, 817_872),
        # embeddings 2 * 80*64 = 10,240; per block: 2 LayerNorms 256, attention 4 * 4,160,
        # MLP 64*256 + 256 + 256*64 + 64 = 33,088: 49,984, twice; final LayerNorm 128;
        # head 64*80 + 80 = 5,200
        ("transformer-char", (80,), 80, 115_536),
    ],
)
def test_parameter_counts(name, features, classes, expected):
    spec = make_model(name, features, classes)
    assert count_params(trainable(spec, jax.eval_shape(spec.init, jax.random.key(0)))) == expected


def test_bad_feature_shapes_and_sizes_are_one_line_config_errors():
    with pytest.raises(ConfigError, match=r"cnn-cifar needs images .*\(32, 32, 3\).*\(784,\)"):
        make_model("cnn-cifar", (784,), 10)
    with pytest.raises(ConfigError, match=r"char-lstm needs 1-D rows.*\(32, 32, 3\)"):
        make_model("char-lstm", (32, 32, 3), 80)
    with pytest.raises(ConfigError, match="width 6 and groups 4"):
        make_model("resnet18-gn", (32, 32, 3), 10, model_args={"width": 6, "groups": 4})
    with pytest.raises(ConfigError, match="not divisible by heads"):
        make_model("transformer-char", (80,), 80, model_args={"width": 10, "heads": 4})


@pytest.mark.parametrize("size, kernel, stride", [(8, 3, 2), (7, 3, 2), (8, 1, 2), (9, 5, 1),
                                                  (6, 3, 1), (7, 3, 3), (6, 4, 2)])
def test_strided_conv_as_matmul_equals_flax_conv(size, kernel, stride):
    """Values and gradients (input and kernel) of 'SAME' convolutions at strides 1-3, odd and
    even sides and kernels, against flax nn.Conv."""
    conv = nn.Conv(5, (kernel, kernel), strides=(stride, stride), padding="SAME", use_bias=False)
    x = jax.random.normal(jax.random.key(0), (2, size, size, 3))
    params = conv.init(jax.random.key(1), x)
    w = params["params"]["kernel"]
    fast = strided_conv_as_matmul(x, w, (stride, stride))
    np.testing.assert_allclose(fast, conv.apply(params, x), atol=1e-5)
    up = jax.random.normal(jax.random.key(2), fast.shape)  # a random upstream gradient
    g_fast = jax.grad(lambda x, w: jnp.sum(strided_conv_as_matmul(x, w, (stride, stride)) * up),
                      argnums=(0, 1))(x, w)
    g_flax = jax.grad(lambda x, w: jnp.sum(conv.apply({"params": {"kernel": w}}, x) * up),
                      argnums=(0, 1))(x, w)
    for a, b in zip(g_fast, g_flax):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
    if stride == 1 and kernel % 2:  # the papers' stride-1 code is the same arithmetic
        np.testing.assert_allclose(fast, conv_as_matmul(x, w), atol=1e-6)


@pytest.mark.parametrize("c_in, c_out", [(3, 5), (5, 5), (6, 4)])
def test_conv_as_matmul_input_gradient_both_ways_equals_flax(c_in, c_out):
    """The stride-1 backward pass takes autodiff's way when c_out > c_in and the rotated-kernel
    convolution otherwise: both give flax nn.Conv's input and kernel gradients."""
    conv = nn.Conv(c_out, (3, 3), padding="SAME", use_bias=False)
    x = jax.random.normal(jax.random.key(0), (2, 7, 6, c_in))
    w = conv.init(jax.random.key(1), x)["params"]["kernel"]
    up = jax.random.normal(jax.random.key(2), (2, 7, 6, c_out))
    ours = jax.grad(lambda x, w: jnp.sum(conv_as_matmul(x, w) * up), argnums=(0, 1))(x, w)
    theirs = jax.grad(lambda x, w: jnp.sum(conv.apply({"params": {"kernel": w}}, x) * up),
                      argnums=(0, 1))(x, w)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_overlapping_max_pool_equals_flax():
    for size in (8, 7):
        x = jax.random.normal(jax.random.key(size), (2, size, size, 4))
        np.testing.assert_array_equal(max_pool_3x3_stride_2(x),
                                      nn.max_pool(x, (3, 3), (2, 2), padding="SAME"))


def assert_same_model(name, shape, classes, model_args=None):
    """conv "matmul" and "xla": the same initial parameters, logits and gradients."""
    fast, slow = (make_model(name, shape, classes, conv=c, model_args=model_args)
                  for c in ("matmul", "xla"))
    params = jax.jit(fast.init)(jax.random.key(0))
    same = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), params,
                        jax.jit(slow.init)(jax.random.key(0)))
    assert all(jax.tree.leaves(same))
    x = jax.random.normal(jax.random.key(1), (4,) + shape)
    y = jnp.arange(4) % classes

    def loss(model, p):  # jitted: op by op, a ResNet's hundreds of small ops take seconds
        logits = model.apply(p, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), logits

    (_, a), g_fast = jax.jit(jax.value_and_grad(lambda p: loss(fast, p), has_aux=True))(params)
    (_, b), g_slow = jax.jit(jax.value_and_grad(lambda p: loss(slow, p), has_aux=True))(params)
    np.testing.assert_allclose(a, b, atol=1e-4)
    for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_slow)):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-3)
    return fast, params, x


def test_cnn_cifar_matmul_equals_xla_and_its_fast_path_descriptions_hold():
    spec, params, x = assert_same_model("cnn-cifar", (9, 9, 3), 10)  # 9 -> 5 -> 3
    apply = jax.jit(spec.apply)
    logits = apply(params, x)
    # the factored split: head(trunk(x) @ kernel + bias) is the model
    f = spec.factored
    z = f.trunk(params, x) @ params[f.name]["kernel"] + params[f.name]["bias"]
    np.testing.assert_allclose(f.head(params, z), logits, atol=1e-5)
    # permuting any hidden layer's units (and its reader's inputs) keeps the function
    for i, layer in enumerate(spec.hidden_units):
        units = params[layer.name]["bias"].shape[0]
        perm = jax.random.permutation(jax.random.key(i), units)
        np.testing.assert_allclose(apply(permute_units(params, layer, perm), x), logits,
                                   atol=1e-5)


def test_tiny_resnet18_gn_matmul_equals_xla():
    assert_same_model("resnet18-gn", (8, 8, 3), 3, {"width": 4, "groups": 2})


@pytest.mark.parametrize("name, args", [("char-lstm", {"units": 16, "embed": 4}),
                                        ("transformer-char", {"width": 16, "heads": 2})])
def test_text_models_read_the_whole_sequence(name, args):
    spec = make_model(name, (12,), 80, model_args=args)
    params = jax.jit(spec.init)(jax.random.key(0))
    chars = jax.random.randint(jax.random.key(1), (3, 12), 0, 80).astype(jnp.float32)
    changed = chars.at[:, 0].set((chars[:, 0] + 1) % 80)

    @jax.jit
    def run(p):  # one compilation; op by op, an LSTM's scan and the attention take seconds
        grads = jax.grad(lambda p: spec.apply(p, chars)[:, 0].sum())(p)
        return spec.apply(p, chars), spec.apply(p, changed), grads

    logits, logits_changed, grads = run(params)
    assert logits.shape == (3, 80) and bool(jnp.all(jnp.isfinite(logits)))
    # the prediction after the last character depends on the first one ...
    assert float(jnp.max(jnp.abs(logits_changed - logits))) > 1e-6
    # ... and the first character's embedding gets a gradient
    rows = grads["Embed_0"]["embedding"][chars[:, 0].astype(int)]
    assert float(jnp.max(jnp.abs(rows))) > 0


def test_transformer_is_causal():
    """Position t's states depend on characters 0..t only: changing characters 4 and 5
    leaves positions 0-3 of the last block's MLP output as they were."""
    spec = make_model("transformer-char", (6,), 80, model_args={"width": 8, "heads": 2})
    params = jax.jit(spec.init)(jax.random.key(0))
    chars = jax.random.randint(jax.random.key(1), (2, 6), 0, 80).astype(jnp.float32)
    module = spec.module

    @jax.jit
    def states(x):  # the last block's MLP output at every position
        out = module.apply({"params": params}, x, capture_intermediates=True)[1]
        return out["intermediates"]["Dense_3"]["__call__"][0]

    later = chars.at[:, 4:].set((chars[:, 4:] + 1) % 80)
    ours, theirs = states(chars), states(later)
    np.testing.assert_allclose(ours[:, :4], theirs[:, :4], atol=1e-6)
    assert not np.allclose(ours[:, 4:], theirs[:, 4:])


def test_batch_norm_model_updates_its_statistics_and_drops_out():
    spec = make_model("cnn-cifar-bn", (8, 8, 3), 10)
    assert spec.collections == ("batch_stats",) and spec.takes_train
    variables = jax.jit(spec.init)(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (6, 8, 8, 3)) + 2.0
    module = spec.module

    @jax.jit
    def train(key):
        return module.apply(variables, x, train=True, rngs={"dropout": key},
                            mutable=["batch_stats"])

    logits, updates = train(jax.random.key(2))
    old, new = variables["batch_stats"], updates["batch_stats"]
    assert all(not bool(jnp.allclose(a, b)) for a, b in zip(jax.tree.leaves(old),
                                                            jax.tree.leaves(new)))
    assert not np.allclose(logits, train(jax.random.key(3))[0])  # dropout masks differ
    np.testing.assert_array_equal(logits, train(jax.random.key(2))[0])
    # evaluation: running averages, no dropout, deterministic
    apply = jax.jit(spec.apply)
    np.testing.assert_array_equal(apply(variables, x), apply(variables, x))
