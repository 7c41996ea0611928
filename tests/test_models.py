import jax
import numpy as np
import pytest

from mcfl.errors import ConfigError
from mcfl.models import count_params, make_model


@pytest.mark.parametrize(
    "name, features, classes, hidden, expected",
    [
        ("mclr", (60,), 10, (), 610),  # FlexCFL Table II, Synthetic
        ("mclr", (784,), 10, (), 7_850),
        ("mlp", (784,), 10, (200, 200), 199_210),
        ("mlp", (784,), 10, (128,), 101_770),  # FlexCFL's MNIST MLP 784-128-10
        ("cnn-fmnist", (784,), 10, (), 3_274_634),  # FlexCFL Table II: 3.27 M
        ("cnn-leaf", (28, 28), 62, (), 6_603_710),  # LEAF FEMNIST CNN
        # LEAF CelebA CNN without batch norm: 3 * 9 * 32 + 32 + 3 * (9 * 32 * 32 + 32)
        # + 6 * 6 * 32 * 2 + 2 (84 -> 42 -> 21 -> 11 -> 6)
        ("cnn-celeba", (84, 84, 3), 2, (), 30_946),
    ],
)
def test_parameter_counts(name, features, classes, hidden, expected):
    spec = make_model(name, features, classes, hidden or (200,))
    params = jax.eval_shape(spec.init, jax.random.key(0))
    assert count_params(params) == expected


def test_forward_shapes():
    spec = make_model("cnn-fmnist", (784,), 10)
    params = spec.init(jax.random.key(0))
    logits = spec.apply(params, np.zeros((3, 784), np.float32))
    assert logits.shape == (3, 10)


def test_bad_models():
    with pytest.raises(ConfigError, match="unknown model 'resnet'.*mclr"):
        make_model("resnet", (60,), 10)
    with pytest.raises(ConfigError, match="square images"):
        make_model("cnn-fmnist", (60,), 10)


def test_matmul_convolutions_equal_flax_conv_in_values_and_gradients():
    """The CNN's 'matmul' code (shifted views + one matmul, reshape max-pool) has the same
    parameters as flax nn.Conv + max_pool and gives the same logits and gradients."""
    import jax.numpy as jnp
    import optax

    from mcfl.models import conv_as_matmul

    fast = make_model("cnn-fmnist", (12, 12), 5, conv="matmul")
    flax_conv = make_model("cnn-fmnist", (12, 12), 5, conv="xla")
    params = fast.init(jax.random.key(0))
    same = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), params,
                        flax_conv.init(jax.random.key(0)))
    assert all(jax.tree.leaves(same))
    x = jax.random.normal(jax.random.key(1), (6, 12, 12))
    y = jnp.arange(6) % 5

    def loss(model, p):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

    np.testing.assert_allclose(fast.apply(params, x), flax_conv.apply(params, x), atol=1e-5)
    g_fast, g_flax = (jax.grad(lambda p, m=m: loss(m, p))(params) for m in (fast, flax_conv))
    for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_flax)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4)
    # LEAF's CelebA CNN: odd sides pool with 'SAME' padding (13 -> 7 -> 4 -> 2 -> 1) alike.
    fast, flax_conv = (make_model("cnn-celeba", (13, 13, 3), 2, conv=c) for c in ("matmul", "xla"))
    params = fast.init(jax.random.key(2))
    images = jax.random.normal(jax.random.key(3), (4, 13, 13, 3))
    np.testing.assert_allclose(fast.apply(params, images), flax_conv.apply(params, images),
                               atol=1e-5)
    # One 3 x 3 convolution by hand: a single 1 in the image copies the flipped kernel.
    image = jnp.zeros((1, 5, 5, 1)).at[0, 2, 2, 0].set(1.0)
    kernel = jnp.arange(9.0).reshape(3, 3, 1, 1)
    out = conv_as_matmul(image, kernel)[0, :, :, 0]
    np.testing.assert_array_equal(out[1:4, 1:4], np.arange(9.0).reshape(3, 3)[::-1, ::-1])
