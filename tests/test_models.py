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
