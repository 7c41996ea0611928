"""FedGroup: EDC grouping against scikit-learn, newcomers, inter-group aggregation, errors."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import algorithm as build
from conftest import planted_gaussian, wrapped
from jax.flatten_util import ravel_pytree
from sklearn.cluster import KMeans
from sklearn.decomposition import TruncatedSVD
from sklearn.metrics import adjusted_rand_score
from sklearn.metrics.pairwise import cosine_similarity as sk_cosine

import mcfl
from mcfl.algorithms.clustered.fedgroup import group_of_updates, inter_group_aggregation
from mcfl.algorithms.framework.base import stack
from mcfl.engine import LocalTraining, RoundClients, Start, train_and_collect
from mcfl.errors import ConfigError
from mcfl.models import make_model


@pytest.fixture(scope="module")
def planted():
    """120 clients of Gaussian-class data whose labels follow one of 4 fixed permutations."""
    return planted_gaussian(120)


def _setup():
    model = make_model("mclr", (12,), 10)
    return model, LocalTraining(model.apply, lr=0.05, batch_size=10)


def test_edc_grouping_agrees_with_sklearn_pipeline(planted):
    model, training = _setup()
    w0 = model.init(jax.random.key(0))
    cold = jnp.arange(40, dtype=jnp.int32)
    trained, _, _ = train_and_collect(
        Start(stack(w0), RoundClients(cold, jnp.zeros_like(cold)), training=training, prox_scale=8),
        planted.arrays, jax.random.key(1))
    flat = jax.vmap(lambda t: ravel_pytree(t)[0])
    updates = np.asarray(flat(trained) - ravel_pytree(w0)[0][None])
    ours = np.asarray(group_of_updates(jnp.asarray(updates), 4, "edc", jax.random.key(2)))
    svd = TruncatedSVD(n_components=4, algorithm="arpack").fit(updates)
    embedding = sk_cosine(updates, svd.components_)
    reference = KMeans(4, init="k-means++", n_init=10, random_state=0).fit_predict(embedding)
    assert adjusted_rand_score(reference, ours) >= 0.95
    assert adjusted_rand_score(planted.true_cluster[:40], ours) >= 0.95
    by_madc = np.asarray(group_of_updates(jnp.asarray(updates), 4, "madc", None))
    assert adjusted_rand_score(planted.true_cluster[:40], by_madc) >= 0.95


def test_groups_recovered_for_all_clients_newcomers_included(planted):
    model, training = _setup()
    algorithm = build("fedgroup", model, training, 30, 8, clusters=4, pretrain_scale=5)
    data = planted.arrays
    state = algorithm.init(data, jax.random.key(0))
    assert int(jnp.sum(state.assignment >= 0)) == 20  # only the alpha * K cold-start clients
    step = jax.jit(chex.assert_max_traces(algorithm.round, n=1))
    for r in range(25):  # rounds with and without newcomers run the same program
        state, _ = step(state, data, jax.random.key(r))
    assert int(jnp.sum(state.assignment < 0)) == 0
    assert adjusted_rand_score(planted.true_cluster, np.asarray(state.assignment)) >= 0.9


def test_round_one_communication_counts_the_cold_start(planted):
    """The authors' pre-training (a newcomer then trains from its group's model); the paper's
    is counted in tests/test_flexcfl_pretrain.py."""
    model, training = _setup()
    algorithm = build("fedgroup", model, training, 30, 8, clusters=4, pretrain_scale=5,
                      pretrain_steps=5)
    data = planted.arrays
    state = algorithm.init(data, jax.random.key(0))
    before = np.asarray(state.assignment)
    round_fn = jax.jit(algorithm.round)
    state, metrics = round_fn(state, data, jax.random.key(0))
    newcomers = int(np.sum((before < 0) & (np.asarray(state.assignment) >= 0)))
    assert newcomers > 0
    # 30 group models down and 30 back, W_0 down and dW up per newcomer, and the cold start's
    # 20 pre-training clients (once).
    assert metrics["models_down"] == 30 + newcomers + 20
    assert metrics["models_up"] == 30 + newcomers + 20
    before = np.asarray(state.assignment)
    state, metrics = round_fn(state, data, jax.random.key(1))
    newcomers = int(np.sum((before < 0) & (np.asarray(state.assignment) >= 0)))
    assert metrics["models_down"] == 30 + newcomers


def test_inter_group_aggregation_formula():
    rng = np.random.default_rng(0)
    theta = rng.normal(size=(3, 5)).astype(np.float32)
    models = {"a": jnp.asarray(theta[:, :2]), "b": jnp.asarray(theta[:, 2:])}  # ravel: a, b
    mixed = inter_group_aggregation(models, 0.5)
    got = np.concatenate([np.asarray(mixed["a"]), np.asarray(mixed["b"])], axis=1)
    norms = np.linalg.norm(theta, axis=1)
    for g in range(3):
        others = [k for k in range(3) if k != g]
        num = theta[g] + 0.5 * sum(theta[k] / norms[k] for k in others)
        den = 1 + 0.5 * sum(1 / norms[k] for k in others)
        np.testing.assert_allclose(got[g], num / den, rtol=1e-5)


@pytest.mark.parametrize("changes, message", [
    ({"clusters": 4, "pretrain_scale": 20, "clients": 60}, r"20 \* 4 = 80 clients, more than"),
    ({"eta_g": -0.1}, "eta_g must be a number >= 0, got -0.1"),
    ({"measure": "emd"}, "unknown measure 'emd'; allowed: edc, madc"),
])
def test_bad_fedgroup_settings(changes, message):
    with pytest.raises(ConfigError, match=message):
        mcfl.resolve(mcfl.RunConfig(algorithm="fedgroup", **changes))


def test_label_aware_shift_sees_what_the_count_vector_test_misses():
    from mcfl.algorithms.clustered.fedgroup import label_shift

    then = jnp.array([[50.0, 50.0, 0.0, 0.0], [50.0, 50.0, 0.0, 0.0], [25.0, 25.0, 25.0, 25.0]])
    now = jnp.array([[0.0, 0.0, 50.0, 50.0],  # labels {0, 1} -> {2, 3}
                     [100.0, 100.0, 0.0, 0.0],  # same labels, twice the data (incremental)
                     [25.0, 25.0, 25.0, 25.0]])  # unchanged
    tau = 0.2 * now.sum(1) / 4
    label = np.asarray(label_shift(now, then, "label"))
    counts = np.asarray(label_shift(now, then, "counts"))
    np.testing.assert_allclose(label, [100 * (0.5 + 1.0 + 0.5), 0.0, 0.0])
    assert list(label > tau) == [True, False, False]
    assert counts[0] == 0.0 and not counts[0] > tau[0]  # the authors' test misses the move


def _current_truth(planted, algorithm, state):
    """The planted cluster of the rows each client holds now (a swap moves them)."""
    shifted = algorithm.described(state, planted.arrays).data
    original_owner = np.asarray(planted.arrays.train_owner)  # rows stored by original client
    first = np.asarray(shifted.train_order)[np.asarray(shifted.train_offsets)]
    return planted.true_cluster[original_owner[first]]


def test_flexcfl_migrates_swapped_clients_and_fedgroup_does_not(planted):
    from mcfl.algorithms.wrappers.shift import with_shift

    model, training = _setup()
    data = planted.arrays
    aris = {}
    for name in ("flexcfl", "fedgroup"):
        algorithm = wrapped(build(name, model, training, 40, 8, clusters=4, pretrain_scale=5),
                            with_shift, "swap_all", shift_prob=1.0)
        state = algorithm.init(data, jax.random.key(0))
        chex.clear_trace_counter()  # both algorithms are wrapped by the same shift round
        step = jax.jit(chex.assert_max_traces(algorithm.round, n=1))
        migrated = 0
        for r in range(30):  # a swap every round
            state, metrics = step(state, data, jax.random.key(r))
            migrated += int(metrics["migrated_clients"])
        truth = _current_truth(planted, algorithm, state)
        aris[name] = adjusted_rand_score(truth, np.asarray(state[0].assignment))
        if name == "flexcfl":
            assert migrated > 0
    assert aris["flexcfl"] >= 0.9, aris
    assert aris["fedgroup"] < aris["flexcfl"] - 0.05, aris


def test_unknown_migration_variant():
    with pytest.raises(ConfigError, match="unknown migration 'emd'; allowed: label, counts"):
        mcfl.RunConfig(algorithm="flexcfl", migration="emd")
