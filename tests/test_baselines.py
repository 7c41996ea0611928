"""The FeSEM paper's other baselines against plain per-client reference loops: FedDist, FedDWS
(Reptile-style server steps) and FedDANE (gradient-corrected proximal local problems)."""

from __future__ import annotations

import chex
import jax
import numpy as np
import optax
import pytest
from conftest import algorithm as build
from conftest import ragged_dataset
from reference import reference_local_train

from mcfl.engine import LocalTraining
from mcfl.engine.sampling import sample_clients
from mcfl.models import make_model

SIZES = [3, 30, 17, 40, 9, 24]


@pytest.fixture(scope="module")
def setup():
    data = ragged_dataset(SIZES, seed=2).arrays
    model = make_model("mclr", (5,), 3)
    training = LocalTraining(model.apply, lr=0.1, batch_size=10, local_epochs=2)
    return data, model, training


def _weighted_mean(trees, weights):
    w = np.asarray(weights, np.float64) / np.sum(weights)
    return jax.tree.map(lambda *leaves: sum(wi * leaf for wi, leaf in zip(w, leaves)), *trees)


@pytest.mark.parametrize("name", ["feddist", "feddws"])
def test_reptile_steps_match_the_per_client_loop(setup, name):
    """W <- W - eps * sum_k a_k (W - W_k): a_k = 1/S (FedDist) or n_k / sum n_j (FedDWS)."""
    data, model, training = setup
    eps = 0.6
    algorithm = build(name, model, training, 4, 2, feddist_eps=eps)
    state = algorithm.init(data, jax.random.key(0))
    key = jax.random.key(3)
    new_state, _ = jax.jit(algorithm.round)(state, data, key)
    sample_key, train_key = jax.random.split(key)
    clients = np.asarray(sample_clients(sample_key, len(SIZES), 4))
    trained = [reference_local_train(training, data, train_key, state.params, int(c))[0]
               for c in clients]
    weights = np.ones(4) if name == "feddist" else np.asarray(SIZES)[clients]
    mean = _weighted_mean(trained, weights)
    expected = jax.tree.map(lambda w, m: w - eps * (w - m), state.params, mean)
    chex.assert_trees_all_close(new_state.params, expected, atol=1e-5)


def test_feddane_matches_the_per_client_loop(setup):
    """Full gradients at W_t, their n_k-weighted mean g; each client runs SGD on
    F_k(W) + <g - grad F_k(W_t), W> + (mu/2)||W - W_t||^2; the n_k-weighted average."""
    data, model, training = setup
    mu = 0.2
    algorithm = build("feddane", model, training, 5, 2, mu=mu)
    state = algorithm.init(data, jax.random.key(0))
    key = jax.random.key(7)
    new_state, metrics = jax.jit(algorithm.round)(state, data, key)
    assert metrics["models_down"] == metrics["models_up"] == 10  # two exchanges of 5 clients

    sample_key, train_key = jax.random.split(key)
    clients = np.asarray(sample_clients(sample_key, len(SIZES), 5))
    x, y = np.asarray(data.x_train), np.asarray(data.y_train)
    offsets = np.asarray(data.train_offsets)

    def full_gradient(c):
        rows = slice(offsets[c], offsets[c] + SIZES[c])
        return jax.grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(
            model.apply(p, x[rows]), y[rows]).mean())(state.params)

    grads = [full_gradient(int(c)) for c in clients]
    sizes = np.asarray(SIZES)[clients]
    g = _weighted_mean(grads, sizes)
    trained = []
    for c, grad in zip(clients, grads):
        correction = jax.tree.map(lambda a, b: a - b, g, grad)
        params, _ = reference_local_train(training.replace(mu=mu), data, train_key,
                                          state.params, int(c), correction=correction)
        trained.append(params)
    chex.assert_trees_all_close(new_state.params, _weighted_mean(trained, sizes), atol=1e-5)
