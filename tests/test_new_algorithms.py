"""Robust (trimmed k-means + robust aggregation), FeSEM-MA (matched averaging), IFCA's
k-means++ start and FlexCFL's RCC / RAC ablations: kernels against NumPy / SciPy, rounds
against plain per-client loops, and the clustered ones against FedAvg on planted clusters."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import algorithm as build
from conftest import planted_gaussian, ragged_dataset
from reference import reference_local_train
from scipy.stats import trim_mean

from mcfl.algorithms.clustered.matching import align, permute_units
from mcfl.algorithms.clustered.shared import ClusterState, flat_models
from mcfl.clustering import masked_statistic, segment_statistic, trimmed_kmeans
from mcfl.clustering.robust import trimmed_seeds
from mcfl.engine import LocalTraining
from mcfl.engine.sampling import sample_clients
from mcfl.models import make_model
from mcfl.runs.evaluation import aggregate
from mcfl.runs.program import evaluate


def test_masked_median_and_trimmed_mean_match_numpy_and_scipy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(11, 4)).astype(np.float32)
    mask = np.array([1, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1], bool)  # 8 rows
    median, m = masked_statistic(jnp.asarray(x), jnp.asarray(mask), "median")
    assert int(m) == 8
    np.testing.assert_allclose(median, np.median(x[mask], axis=0), rtol=1e-6)
    trimmed, _ = masked_statistic(jnp.asarray(x), jnp.asarray(mask), "trimmed_mean", 0.25)
    np.testing.assert_allclose(trimmed, trim_mean(x[mask], 0.25, axis=0), rtol=1e-5)
    empty, m = masked_statistic(jnp.asarray(x), jnp.zeros(11, bool), "median")
    assert int(m) == 0 and np.all(np.asarray(empty) == 0)
    # Untrimmed means of segments (trimmed k-means' centers) take a sort-free path: the same
    # values, an empty segment at 0, rows of segment K (trimmed) in none.
    segments = np.array([0, 3, 0, 2, 2, 3, 0, 2, 3, 0, 2])
    means, counts = segment_statistic(jnp.asarray(x), jnp.asarray(segments), 3, "trimmed_mean")
    np.testing.assert_array_equal(counts, [4, 0, 4])
    for k in range(3):
        want = x[segments == k].mean(0) if (segments == k).any() else np.zeros(4)
        np.testing.assert_allclose(means[k], want, rtol=1e-5, atol=1e-7)


def test_masked_statistics_match_numpy_and_scipy_for_every_count_of_rows():
    """The top_k selection covers every m from 0 to n (odd and even, ties, every cut of a 0.2
    trim), against numpy's median and scipy's trim_mean of the chosen rows."""
    rng = np.random.default_rng(3)
    x = np.round(rng.normal(size=(13, 5)), 1).astype(np.float32)  # rounding makes ties
    order = rng.permutation(13)
    for m in range(14):
        mask = np.zeros(13, bool)
        mask[order[:m]] = True
        median, count = masked_statistic(jnp.asarray(x), jnp.asarray(mask), "median")
        trimmed, _ = masked_statistic(jnp.asarray(x), jnp.asarray(mask), "trimmed_mean", 0.2)
        assert int(count) == m
        if m == 0:
            assert np.all(np.asarray(median) == 0) and np.all(np.asarray(trimmed) == 0)
            continue
        np.testing.assert_allclose(median, np.median(x[mask], axis=0), rtol=1e-6)
        np.testing.assert_allclose(trimmed, trim_mean(x[mask], 0.2, axis=0), rtol=1e-5,
                                   atol=1e-6)


def test_trimmed_kmeans_matches_a_numpy_loop_and_trims_the_outliers():
    rng = np.random.default_rng(1)
    centers = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    x = np.concatenate([c + rng.normal(size=(30, 2)) for c in centers]
                       + [np.array([[60.0, 60.0], [-50.0, 40.0], [45.0, -55.0]])])
    x = x.astype(np.float32)
    key = jax.random.key(2)
    _, found, _ = trimmed_kmeans(key, jnp.asarray(x), 3, trim=0.05, iterations=8, restarts=1)
    # The same procedure in NumPy, from the same seeds (one restart).
    seeds = trimmed_seeds(jax.random.split(key, 1)[0], jnp.asarray(x), 3, 5)
    c = np.asarray(seeds, np.float64)
    cut = int(np.ceil(0.05 * len(x)))
    for _ in range(8):
        d2 = ((x[:, None, :] - c[None]) ** 2).sum(-1)
        lab, near = d2.argmin(1), d2.min(1)
        keep = np.ones(len(x), bool)
        keep[np.argsort(-near)[:cut]] = False
        c = np.stack([x[keep & (lab == k)].mean(0) if np.any(keep & (lab == k)) else c[k]
                      for k in range(3)])
    np.testing.assert_allclose(found, c, rtol=1e-4, atol=1e-4)
    # With restarts, the run of least trimmed cost leaves out the three outliers (and the two
    # farthest group members: ceil(0.05 * 93) = 5 rows are trimmed).
    labels, found, trimmed = trimmed_kmeans(key, jnp.asarray(x), 3, trim=0.05, iterations=8)
    assert {90, 91, 92} <= set(np.flatnonzero(np.asarray(trimmed)).tolist())
    assert np.asarray(trimmed).sum() == 5
    assert np.abs(np.sort(np.asarray(found)[:, 0]) - [0, 0, 10]).max() < 1
    assert len(set(np.asarray(labels)[:90].reshape(3, 30)[:, 0])) == 3  # one cluster a group


def _training(model, lr=0.1):
    return LocalTraining(model.apply, lr=lr, batch_size=10, local_epochs=1)


@pytest.mark.parametrize("aggregator", ["median", "trimmed_mean"])
def test_robust_round_matches_the_per_client_loop(aggregator):
    """Sampled clients train from their (fixed) cluster's model; each cluster takes the
    coordinate-wise median or trimmed mean of its members' models; empty clusters keep theirs."""
    dataset = ragged_dataset([13, 30, 17, 40, 9, 24, 12, 25], seed=4)
    data = dataset.arrays
    model = make_model("mclr", (5,), 3)
    training = _training(model)
    algorithm = build("robust", model, training, 6, 3, clusters=3, robust_aggregator=aggregator,
                      robust_trim=0.2)
    models = jax.vmap(model.init)(jax.random.split(jax.random.key(5), 3))
    assignment = jnp.array([0, 1, 2, 0, 1, 0, 1, 0], jnp.int32)
    state = ClusterState.create(models, assignment, jnp.ones(3, bool))
    key = jax.random.key(8)
    new_state, _ = jax.jit(algorithm.round)(state, data, key)
    sample_key, train_key = jax.random.split(key)
    clients = np.asarray(sample_clients(sample_key, 8, 6))
    flat = lambda t: np.concatenate([np.ravel(v) for v in jax.tree.leaves(t)])  # noqa: E731
    trained = {int(c): flat(reference_local_train(
        training, data, train_key, jax.tree.map(lambda m, c=c: m[assignment[c]], models),
        int(c))[0]) for c in clients}
    got = np.asarray(flat_models(new_state.models))
    for k in range(3):
        members = np.stack([trained[c] for c in clients if assignment[c] == k] or [np.zeros(0)])
        if members.size == 0:
            np.testing.assert_allclose(got[k], np.asarray(flat_models(models))[k])
        elif aggregator == "median":
            np.testing.assert_allclose(got[k], np.median(members, axis=0), atol=1e-5)
        else:
            np.testing.assert_allclose(got[k], trim_mean(members, 0.2, axis=0), atol=1e-5)
    np.testing.assert_array_equal(new_state.assignment, assignment)  # one-shot clustering


@pytest.mark.parametrize("start_epochs", [0, 3])
def test_robust_start_points_are_local_models_after_the_start_epochs(start_epochs):
    """The one-shot clustering's points: each client's model trained from W_0 for the run's E
    epochs (robust_start_epochs 0) or for robust_start_epochs epochs."""
    data = ragged_dataset([13, 30, 17, 40], seed=4).arrays
    model = make_model("mclr", (5,), 3)
    training = _training(model)
    algorithm = build("robust", model, training, 4, 4, clusters=2,
                      robust_start_epochs=start_epochs)
    key = jax.random.key(3)
    clients = jnp.arange(4, dtype=jnp.int32)
    points = jax.jit(lambda: algorithm.client_state.start.points(
        data, key, algorithm.hp, clients))()
    init_key, train_key, _ = jax.random.split(key, 3)
    w0 = model.init(init_key)
    epochs = training.replace(local_epochs=start_epochs or training.local_epochs)
    for c in range(4):
        want, _ = reference_local_train(epochs, data, train_key, w0, c)
        np.testing.assert_allclose(points[c], np.asarray(flat_models(
            jax.tree.map(lambda x: x[None], want)))[0], atol=1e-5)


@pytest.mark.parametrize("name, features", [("mlp", (6,)), ("cnn-fmnist", (8, 8))])
def test_matching_undoes_a_permutation_and_keeps_the_function(name, features):
    model = make_model(name, features, 4, hidden=(7, 5), conv="matmul")
    center = model.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (3,) + features)
    member = center
    for i, layer in enumerate(model.hidden_units):  # scramble every hidden layer's units
        units = center[layer.name]["bias"].shape[0]
        member = permute_units(member, layer, jax.random.permutation(jax.random.key(i), units))
    np.testing.assert_allclose(model.apply(member, x), model.apply(center, x), atol=1e-5)
    noisy = jax.tree.map(lambda p: p + 1e-3 * jax.random.normal(jax.random.key(9), p.shape),
                         member)
    aligned = jax.jit(lambda m, c: align(m, c, model.hidden_units))(noisy, center)
    chex.assert_trees_all_close(aligned, center, atol=5e-3)
    np.testing.assert_allclose(model.apply(aligned, x), model.apply(noisy, x), atol=1e-5)


def test_fesem_ma_round_matches_the_per_client_loop():
    """FeSEM's round (Eq. 8 training, E-step against the old centers), with every member's
    hidden units matched to its new center's before the unweighted M-step (Eq. 10)."""
    from scipy.optimize import linear_sum_assignment

    dataset = ragged_dataset([13, 30, 17, 40, 9, 24], num_features=6, seed=6)
    data = dataset.arrays
    model = make_model("mlp", (6,), 3, hidden=(5,))
    training = _training(model)
    lam = 0.1
    algorithm = build("fesem_ma", model, training, 4, 2, clusters=2, lam=lam, restarts=2)
    centers = jax.vmap(model.init)(jax.random.split(jax.random.key(3), 2))
    assignment = jnp.array([0, 1, 0, 1, 0, 1], jnp.int32)
    state = ClusterState.create(centers, assignment, jnp.ones(2, bool))
    key = jax.random.key(11)
    new_state, _ = jax.jit(algorithm.round)(state, data, key)

    sample_key, train_key = jax.random.split(key)
    clients = np.asarray(sample_clients(sample_key, 6, 4))
    counts = np.asarray(data.train_counts, np.float64)
    old = [jax.tree.map(lambda m, k=k: np.asarray(m[k], np.float64), centers) for k in range(2)]
    flat = lambda t: np.concatenate([np.ravel(v) for v in jax.tree.leaves(t)])  # noqa: E731
    members = {0: [], 1: []}
    for c in clients:
        mu = 2 * lam * counts.mean() / counts[c]
        start = jax.tree.map(lambda m, c=c: m[assignment[c]], centers)
        p, _ = reference_local_train(training.replace(mu=mu), data, train_key, start, int(c))
        p = jax.tree.map(lambda v: np.asarray(v, np.float64), p)
        k = int(np.argmin([((flat(p) - flat(o)) ** 2).sum() for o in old]))
        # match hidden units to the center by incoming weights and bias (Hungarian)
        mine = np.concatenate([p["Dense_0"]["kernel"].T, p["Dense_0"]["bias"][:, None]], 1)
        ref = np.concatenate([old[k]["Dense_0"]["kernel"].T, old[k]["Dense_0"]["bias"][:, None]],
                             1)
        rows, cols = linear_sum_assignment(((mine[:, None] - ref[None]) ** 2).sum(-1))
        perm = np.empty(5, int)
        perm[cols] = rows
        p["Dense_0"] = {"kernel": p["Dense_0"]["kernel"][:, perm],
                        "bias": p["Dense_0"]["bias"][perm]}
        p["Dense_1"] = {**p["Dense_1"], "kernel": p["Dense_1"]["kernel"][perm]}
        members[k].append(p)
    for k in range(2):
        got = jax.tree.map(lambda m, k=k: m[k], new_state.models)
        want = (jax.tree.map(lambda *v: np.mean(v, axis=0), *members[k]) if members[k]
                else old[k])
        chex.assert_trees_all_close(got, want, atol=2e-5)


@pytest.fixture(scope="module")
def planted():
    return planted_gaussian(120)


@pytest.mark.parametrize("name", ["robust", "fesem_ma"])
def test_clustered_baselines_beat_fedavg_on_planted_clusters(planted, name):
    """On 4 planted label permutations one model cannot fit every client; Robust and FeSEM-MA
    find the clusters and fit each (as their papers report against FedAvg)."""
    data = planted.arrays
    model = make_model("mlp", (12,), 10, hidden=(16,))
    training = LocalTraining(model.apply, lr=0.1, batch_size=10, local_epochs=2)
    results = {}
    for algo, extra in (("fedavg", {}), (name, {"clusters": 4})):
        algorithm = build(algo, model, training, 120, 16, **extra)
        state = jax.jit(algorithm.init)(data, jax.random.key(0))
        step = jax.jit(algorithm.round)
        for r in range(8):
            state, _ = step(state, data, jax.random.key(r))
        results[algo] = aggregate(evaluate(algorithm.algorithm, algorithm.device_state(state),
                                           planted, model.apply, 16))
    assert results[name]["accuracy_micro"] > results["fedavg"]["accuracy_micro"] + 0.25, results


def test_ifca_kmeans_plus_plus_starts_from_sampled_local_models():
    dataset = ragged_dataset([13, 30, 17, 40, 9, 24], seed=7)
    data = dataset.arrays
    model = make_model("mclr", (5,), 3)
    training = _training(model)
    algorithm = build("ifca", model, training, 4, 2, clusters=2, ifca_init="kmeans++")
    key = jax.random.key(12)
    state = jax.jit(algorithm.init)(data, key)
    init_key, sample_key, train_key, _ = jax.random.split(key, 4)
    w0 = model.init(init_key)
    sampled = np.asarray(sample_clients(sample_key, 6, 4))
    local = [np.concatenate([np.ravel(v) for v in jax.tree.leaves(
        reference_local_train(training, data, train_key, w0, int(c))[0])]) for c in sampled]
    starts = np.asarray(flat_models(state.models))
    for start in starts:  # each of the K starts is one of the sampled clients' local models
        assert min(np.abs(start - loc).max() for loc in local) < 1e-5
    assert not np.allclose(starts[0], starts[1])


def test_rcc_groups_around_random_clients_and_rac_skips_the_pre_training(planted):
    model = make_model("mclr", (12,), 10)
    training = _training(model, lr=0.05)
    rcc = build("fedgroup", model, training, 20, 8, clusters=4, pretrain_scale=5,
                measure="random")
    state = jax.jit(rcc.init)(planted.arrays, jax.random.key(0))
    grouped = np.asarray(state.assignment)
    assert (grouped >= 0).sum() == 20 and len(np.unique(grouped[grouped >= 0])) == 4
    rac = build("fedgroup", model, training, 20, 8, clusters=4, pretrain_scale=5,
                newcomers="random")
    state = jax.jit(rac.init)(planted.arrays, jax.random.key(0))
    _, metrics = jax.jit(rac.round)(state, planted.arrays, jax.random.key(1))
    # round 1: the 20 cold-start clients' exchange plus the 20 sampled; no newcomer pre-trains
    assert metrics["models_down"] == 20 + 20
