"""Partial personalisation (FedPer, LG-FedAvg): each client's own layers and the averaged shared
ones equal a plain per-client loop; a layer count the model cannot split is one clear error."""

from __future__ import annotations

import chex
import jax
import numpy as np
import pytest
from conftest import algorithm as build

from mcfl.engine import LocalTraining
from mcfl.errors import ConfigError
from mcfl.models import make_model
from mcfl.sampling import sample_clients
from tests.reference import reference_local_train

# (algorithm, its layer-count key, the own layers of MLP 5-8-6-3 it gives for count 1)
SPLITS = {"fedper": ("layers", {"Dense_2"}), "lg_fedavg": ("local_layers", {"Dense_0"})}


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_own_layers_stay_and_shared_layers_average_as_a_per_client_loop(ragged, name):
    """Two rounds, 4 of 6 ragged clients each: a sampled client trains the server's shared
    layers with its own (W_0's the first time); the shared layers become the n_i-weighted mean
    of the trained ones; only the sampled clients' own layers change."""
    data = ragged.arrays
    model = make_model("mlp", (5,), 3, hidden=(8, 6))
    training = LocalTraining(model.apply, lr=0.05, batch_size=10, local_epochs=2)
    key_name, own = SPLITS[name]
    algorithm = build(name, model, training, 4, 3, **{key_name: 1})
    state = algorithm.init(data, jax.random.key(0))
    w0 = jax.tree.map(lambda x: x, {**state.shared[0], **state.shared[1]})
    assert set(state.shared[1]) == own and set(state.shared[0]) | own == set(w0)
    shared = {k: v for k, v in w0.items() if k not in own}
    rows = [{k: w0[k] for k in own} for _ in range(6)]
    step = jax.jit(algorithm.round)
    for r in range(2):
        key = jax.random.key(10 + r)
        state, _ = step(state, data, key)
        sample_key, train_key = jax.random.split(key)
        clients = np.asarray(sample_clients(sample_key, 6, 4))
        trained = {}
        for c in clients:
            trained[c], _ = reference_local_train(training, data, train_key,
                                                  {**shared, **rows[c]}, int(c))
        weights = np.asarray(data.train_counts)[clients].astype(np.float32)
        weights /= weights.sum()
        shared = {k: jax.tree.map(lambda *leaves, w=weights: sum(a * x for a, x in zip(w, leaves)),
                                  *[trained[c][k] for c in clients]) for k in shared}
        for c in clients:
            rows[c] = {k: trained[c][k] for k in own}
        chex.assert_trees_all_close(state.shared[0], shared, atol=1e-5)
        for c in range(6):
            chex.assert_trees_all_close(jax.tree.map(lambda x, c=c: x[c], state.rows), rows[c],
                                        atol=1e-5)
    # evaluated with the shared layers and its own
    models, index = algorithm.algorithm.client_models(state)
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[index[2]], models),
                                {**shared, **rows[2]}, atol=1e-5)


def test_a_layer_count_the_model_cannot_split_is_one_clear_error(ragged):
    model = make_model("mlp", (5,), 3, hidden=(8,))
    training = LocalTraining(model.apply, lr=0.05, batch_size=10)
    algorithm = build("fedper", model, training, 4, 3, layers=2)
    with pytest.raises(ConfigError, match=r"fedper_layers=2: the model has 2 layers "
                       r"\(Dense_0, Dense_1\); between 1 and 1"):
        algorithm.init(ragged.arrays, jax.random.key(0))
