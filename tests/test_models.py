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


def test_row_outer_dense_gives_autodiffs_gradients_per_client_and_falls_back():
    """`mcfl.models.row_outer`: on CPU the fast paths compute small-batch ``nn.Dense`` kernel
    gradients as sums of row outer products; vmapped over clients (as the engine runs them)
    the gradients equal plain autodiff's (fast_paths off); above MAX_ROWS rows, and outside
    the interceptor, the layer runs as flax's own."""
    import jax.numpy as jnp
    import optax

    from mcfl.models import row_outer

    fast = make_model("mlp", (12,), 5, hidden=(7,), fast_paths="auto")
    plain = make_model("mlp", (12,), 5, hidden=(7,), fast_paths="off")
    clients = jax.vmap(fast.init)(jax.random.split(jax.random.key(0), 4))

    def grads(model, rows):
        x = jax.random.normal(jax.random.key(1), (4, rows, 12))
        y = jnp.arange(4 * rows).reshape(4, rows) % 5

        def loss(p, xb, yb):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, xb), yb).mean()

        return jax.jit(jax.vmap(jax.grad(loss)))(clients, x, y)

    for rows in (1, 10, row_outer.MAX_ROWS, row_outer.MAX_ROWS + 1):
        for a, b in zip(jax.tree.leaves(grads(fast, rows)), jax.tree.leaves(grads(plain, rows))):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # kernel gradients are products in plain autodiff, sums of outer products on the fast
    # path when the batch is small, products again above MAX_ROWS
    one = jax.tree.map(lambda leaf: leaf[0], clients)

    def products(model, rows):
        x = jnp.zeros((rows, 12))
        jaxpr = jax.make_jaxpr(jax.grad(lambda p: model.apply(p, x).sum()))(one)
        return str(jaxpr).count("dot_general[")

    assert products(fast, 10) < products(plain, 10)
    assert products(fast, row_outer.MAX_ROWS + 1) == products(plain, row_outer.MAX_ROWS + 1)
    # by hand: one row x, cotangent g: the kernel gradient is the outer product x g^T
    x, g = jnp.array([[1.0, 2.0]]), jnp.array([[3.0, -1.0, 0.5]])
    _, pullback = jax.vjp(row_outer.outer_sum_matmul, x, jnp.ones((2, 3)))
    np.testing.assert_array_equal(pullback(g)[1], np.outer([1.0, 2.0], [3.0, -1.0, 0.5]))


def test_lstm_recurrence_backward_equals_autodiff_of_the_scan():
    """`mcfl.models.lstm_recurrence` (gates in one pass, a hand-written backward pass with the
    recurrent kernel's gradient as one product over all steps) against autodiff of the
    textbook cell in a scan: values and gradients."""
    import jax.numpy as jnp

    from mcfl.models.lstm_recurrence import lstm_recurrence

    steps, batch, width = 6, 3, 5
    projected = jax.random.normal(jax.random.key(0), (steps, batch, 4 * width))
    recurrent = 0.5 * jax.random.normal(jax.random.key(1), (width, 4 * width))
    weights = jax.random.normal(jax.random.key(2), (steps, batch, width))

    def by_autodiff(p, r):
        zeros = jnp.zeros((batch, width))

        def step(carry, p_t):  # the textbook cell (TensorFlow's BasicLSTMCell gates)
            c, h = carry
            i, f, g, o = jnp.split(p_t + h @ r, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (c, h), h

        return jax.lax.scan(step, (zeros, zeros), p)[1]

    np.testing.assert_allclose(lstm_recurrence(projected, recurrent),
                               by_autodiff(projected, recurrent), rtol=1e-6, atol=1e-6)
    loss = lambda f: lambda p, r: jnp.sum(jnp.sin(f(p, r)) * weights)  # noqa: E731
    ours = jax.grad(loss(lstm_recurrence), argnums=(0, 1))(projected, recurrent)
    theirs = jax.grad(loss(by_autodiff), argnums=(0, 1))(projected, recurrent)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # vmapped over clients, as the engine runs it
    many = jax.vmap(jax.grad(loss(lstm_recurrence), argnums=1))(
        jnp.stack([projected, 2 * projected]), jnp.stack([recurrent, -recurrent]))
    np.testing.assert_allclose(many[1], jax.grad(loss(by_autodiff), argnums=1)(
        2 * projected, -recurrent), rtol=1e-5, atol=1e-5)
