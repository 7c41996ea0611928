"""CFL-GP (`mcfl.algorithms.clustered.cflgp`): its rounds against a plain per-client loop
(gradients one client at a time, the profile as an explicit numpy matrix, its SVD by numpy and
k-means by scikit-learn), the running mean and the Gram route by hand, planted clusters recovered,
bad settings refused, and the released code's criterion."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import algorithm as build
from conftest import planted_gaussian
from reference import client_train_rows
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

import mcfl
from mcfl.algorithms.clustered.cflgp import (
    filled_gram,
    matched_labels,
    profile_features,
    updated_profile,
)
from mcfl.engine import LocalTraining
from mcfl.engine.batch_rule import epoch_positions
from mcfl.engine.sampling import sample_clients
from mcfl.errors import ConfigError
from mcfl.models import make_model

K, CLIENTS, PER_ROUND, BATCH = 3, 12, 8, 40


@pytest.fixture(scope="module")
def planted():
    """12 clients of 3 planted label permutations (about 400 training rows each)."""
    return planted_gaussian(CLIENTS, K, "permuted")


def _bound(criterion="round_robin", per_round=PER_ROUND, k=K, **params):
    model = make_model("mclr", (12,), 10)
    training = LocalTraining(model.apply, batch_size=BATCH, lr=0.05, local_steps=1)
    return model, build("cflgp", model, training, per_round, 4, k,
                        cflgp_criterion=criterion, **params)


def _flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(tree)])


def _model(models, k):
    return jax.tree.map(lambda m: m[k], models)


def _gradient(model, params, data, key, client: int) -> np.ndarray:
    """One client's gradient of its mean cross-entropy on the first batch of the round `key`
    (the batch rule's epoch 0 order, computed whole; a short client's batch is all its rows)."""
    x, y = client_train_rows(data, client)
    order = np.asarray(_positions(key, client, 0, int(data.train_counts[client])))
    rows = order[:BATCH]
    return _flat(_mean_loss_gradient(model.apply, params, x[rows], y[rows]))


_positions = jax.jit(epoch_positions, static_argnums=3)  # (the batch rule's whole epoch order)


@jax.jit(static_argnums=0)
def _mean_loss_gradient(apply_fn, params, x, y):
    return jax.grad(lambda p: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
        apply_fn(p, x), y)))(params)


def _best_agreement(labels, old) -> int:
    """The most clients keeping their `old` label under some renaming of `labels` (the
    released code's search over all K! permutations)."""
    return max(int(np.sum(np.asarray(perm)[labels] == old))
               for perm in itertools.permutations(range(K)))


def _reference_round(model, state, data, key, period=2, stop=10, server_lr=0.1):
    """One CFL-GP round (paper version, gradient protocol) client by client, from `state`:
    returns (profile, visits, features of the profiled clients, their mask, the sampled
    clients, whether it clustered). The new labels are the algorithm's (checked by the caller
    against scikit-learn's partition): the model step is then recomputed with them here."""
    sample_key, train_key = jax.random.split(key)
    clients = np.asarray(sample_clients(sample_key, CLIENTS, PER_ROUND))
    t = int(state.round)
    profile, visits = np.array(state.profile), np.array(state.visits)
    clustering = t % period == 0 and t < stop
    features = profiled = None
    if clustering:
        block = (t // period) % K
        criterion = _model(state.models, block)
        for c in clients:
            g = _gradient(model, criterion, data, jax.random.fold_in(train_key, 1), int(c))
            visits[block, c] += 1
            profile[block, c] += (g - profile[block, c]) / visits[block, c]
        # The profile matrix [K d, C] with each column a client never filled at its block's
        # mean of filled ones; its SVD by numpy; Z = U_K^T G.
        filled = []
        for k in range(K):
            seen = visits[k] > 0
            mean = profile[k][seen].mean(0) if seen.any() else np.zeros(profile.shape[2])
            filled.append(np.where(seen[:, None], profile[k], mean[None]))
        g_matrix = np.concatenate(filled, axis=1).T.astype(np.float64)  # [K d, C]
        u, _, _ = np.linalg.svd(g_matrix, full_matrices=False)
        features = (u[:, :K].T @ g_matrix).T  # [C, K]
        profiled = visits.sum(0) > 0
    return profile, visits, features, profiled, clients, train_key


def _check_round(model, state, new_state, data, key, metrics):
    old = np.asarray(state.assignment)
    profile, visits, features, profiled, clients, train_key = _reference_round(
        model, state, data, key)
    np.testing.assert_array_equal(new_state.visits, visits)
    np.testing.assert_allclose(new_state.profile, profile, atol=1e-6)
    labels = np.asarray(new_state.assignment)
    if features is None:
        np.testing.assert_array_equal(labels, old)
        assert metrics["reclustered"] == 0 and metrics["models_up"] == PER_ROUND
    else:
        sk = KMeans(K, n_init=10, random_state=0).fit(features[profiled]).labels_
        assert adjusted_rand_score(sk, labels[profiled]) == 1.0  # the same partition
        assert np.sum(labels[profiled] == old[profiled]) == _best_agreement(sk, old[profiled])
        np.testing.assert_array_equal(labels[~profiled], old[~profiled])
        assert metrics["reclustered"] == 1 and metrics["models_up"] == 2 * PER_ROUND
    # Each cluster steps by 0.1 times its members' plain mean gradient at its (new) model.
    grads = {k: [] for k in range(K)}
    for c in clients:
        k = int(labels[c])
        grads[k].append(_gradient(model, _model(state.models, k), data, train_key, int(c)))
    for k in range(K):
        want = _flat(_model(state.models, k))
        if grads[k]:
            want = want - 0.1 * np.mean(grads[k], axis=0)
        np.testing.assert_allclose(_flat(_model(new_state.models, k)), want, atol=1e-5)
    np.testing.assert_array_equal(new_state.sizes, np.bincount(labels, minlength=K))


def test_rounds_match_a_per_client_reference_loop(planted):
    """Rounds 0 (clustering: block 0), 1 (ordinary) and 6 (clustering: block 0 again, a
    running mean of two visits for some clients, blocks 1 and 2 filled at rounds 2 and 4) of
    the jitted round against `_reference_round`; 8 of 12 clients a round, so some columns are
    never filled and some clients never profiled."""
    model, bound = _bound()
    data = planted.arrays
    state = jax.jit(bound.init)(data, jax.random.key(0))
    step = jax.jit(bound.round)
    for t in range(7):
        key = jax.random.fold_in(jax.random.key(1), t)
        new_state, metrics = step(state, data, key)
        if t in (0, 1, 6):
            _check_round(model, state, new_state, data, key, jax.device_get(metrics))
        state = new_state
    visits = np.asarray(state.visits)
    assert visits.sum(1).tolist() == [2 * PER_ROUND, PER_ROUND, PER_ROUND]
    # The Gram matrices kept are those of the profile.
    profile = np.asarray(state.profile, np.float64)
    np.testing.assert_allclose(state.gram, np.einsum("kid,kjd->kij", profile, profile),
                               rtol=1e-4, atol=1e-6)


def test_the_profile_is_a_running_mean_of_each_clients_visits():
    """Four visits of block 1 by clients [S = 3] with some not reporting (and a Poisson
    filler repeating client 0, not reporting): each column is the plain mean of the messages
    its client reported, a column nobody filled stays 0, block 0 is untouched, visits count
    the reports and the Gram is the profile's."""
    rng = np.random.default_rng(0)
    count, size = 5, 4
    profile = jnp.zeros((2, count, size))
    gram = jnp.zeros((2, count, count))
    visits = jnp.zeros((2, count), jnp.int32)
    sent = {c: [] for c in range(count)}
    plan = [([0, 1, 2], [1, 1, 1]), ([1, 3, 0], [1, 1, 0]), ([0, 3, 1], [1, 0, 1]),
            ([0, 1, 0], [1, 1, 0])]
    for clients, present in plan:
        messages = rng.normal(size=(3, size)).astype(np.float32)
        for c, p, m in zip(clients, present, messages):
            if p:
                sent[c].append(m)
        profile, gram, visits = jax.jit(updated_profile)(
            profile, gram, visits, jnp.int32(1), jnp.array(clients), jnp.asarray(messages),
            jnp.array(present, jnp.float32))
    for c in range(count):
        want = np.mean(sent[c], axis=0) if sent[c] else np.zeros(size)
        np.testing.assert_allclose(profile[1, c], want, rtol=1e-5, atol=1e-6)
    assert np.asarray(visits[1]).tolist() == [len(sent[c]) for c in range(count)]
    assert not np.any(np.asarray(profile[0])) and not np.any(np.asarray(visits[0]))
    p = np.asarray(profile, np.float64)
    np.testing.assert_allclose(gram, np.einsum("kid,kjd->kij", p, p), rtol=1e-5, atol=1e-6)


def test_features_from_the_gram_are_the_svd_projection_of_the_filled_profile():
    """`filled_gram` + `profile_features` against numpy's SVD of the explicit profile
    matrix (unfilled columns at their block's mean): the same distances between clients
    (the features are Z = U_K^T G up to signs); and label matching by hand."""
    rng = np.random.default_rng(1)
    profile = rng.normal(size=(3, 7, 5))
    visits = rng.integers(0, 3, (3, 7))
    visits[2] = 0  # a block nobody filled
    profile = np.where(visits[..., None] > 0, profile, 0.0)
    gram = np.einsum("kid,kjd->kij", profile, profile)
    got = np.asarray(profile_features(filled_gram(jnp.asarray(gram, jnp.float32),
                                                  jnp.asarray(visits)), 3))
    filled = [np.where(visits[k][:, None] > 0, profile[k],
                       profile[k][visits[k] > 0].mean(0) if (visits[k] > 0).any() else 0.0)
              for k in range(3)]
    g_matrix = np.concatenate(filled, axis=1).T
    u, _, _ = np.linalg.svd(g_matrix, full_matrices=False)
    want = (u[:, :3].T @ g_matrix).T

    def distances(z):
        return np.linalg.norm(z[:, None] - z[None], axis=-1)

    np.testing.assert_allclose(distances(got), distances(want), rtol=1e-4, atol=1e-4)
    # k-means named the old clusters 0, 1, 2 as 2, 0, 1: renamed back; a client that moved
    # (the last) keeps its new cluster.
    old = jnp.array([0, 0, 1, 1, 2, 2])
    new = jnp.array([2, 2, 0, 0, 1, 0])
    assert matched_labels(new, old, jnp.ones(6), 3).tolist() == [0, 0, 1, 1, 2, 1]


def test_planted_clusters_are_found_in_the_first_rounds():
    """Four planted label permutations over 16 clients, all taking part: ARI 1 from the first
    clustering round on, and the clusters' models learn (their clients' loss falls)."""
    planted = planted_gaussian(16, 4, "permuted")
    _, bound = _bound(per_round=16, k=4)
    data = planted.arrays
    state = jax.jit(bound.init)(data, jax.random.key(0))
    step = jax.jit(bound.round)
    losses, aris = [], []
    for t in range(6):
        state, metrics = step(state, data, jax.random.fold_in(jax.random.key(2), t))
        losses.append(float(metrics["train_loss"]))
        aris.append(adjusted_rand_score(planted.true_cluster, np.asarray(state.assignment)))
    assert aris == [1.0] * 6, aris
    assert losses[-1] < losses[1]


@pytest.mark.parametrize("changes, message", [
    ({"cflgp_period": 0}, "cflgp_period must be an integer >= 1, got 0"),
    ({"cflgp_criterion": "fixed1"}, "cflgp_criterion"),
    ({"cflgp_protocol": "fedavg"}, "cflgp_protocol"),
    ({"cflgp_stop": -1}, "cflgp_stop must be an integer >= 1"),
    ({"server_lr": 0.0}, "server_lr"),
])
def test_bad_settings_are_one_line_config_errors(changes, message):
    with pytest.raises(ConfigError, match=message) as refused:
        mcfl.RunConfig(algorithm="cflgp", **changes)
    assert "\n" not in str(refused.value)


def test_models_with_batch_statistics_are_refused():
    model = make_model("cnn-cifar-bn", (8, 8, 3), 10)
    training = LocalTraining(model.apply, batch_size=4, collections=model.collections)
    with pytest.raises(ConfigError, match="cflgp clusters clients by their gradients"):
        build("cflgp", model, training, 4, 2, 2)


def test_the_released_codes_criterion(planted):
    """cflgp_criterion fixed0 (the released code): block 0 only, at every clustering round,
    holding the gradient each client sent for its own cluster's model, with the code's beta
    (1 while floor((t + 1) / (K P)) = 0: the latest gradient, here at round 2); the paper's
    round robin fills block (t / P) mod K at theta_k."""
    model, released = _bound("fixed0", per_round=CLIENTS)
    _, paper = _bound("round_robin", per_round=CLIENTS)
    data = planted.arrays
    for bound, filled in ((released, [2, 0, 0]), (paper, [1, 1, 0])):
        state = jax.jit(bound.init)(data, jax.random.key(0))
        step = jax.jit(bound.round)
        for t in range(3):
            key = jax.random.fold_in(jax.random.key(3), t)
            before, (state, metrics) = state, step(state, data, key)
        assert (np.asarray(state.visits) > 0).sum(1).tolist() == [CLIENTS if f else 0
                                                                   for f in filled]
        assert np.asarray(state.visits).sum(1).tolist() == [CLIENTS * f for f in filled]
        assert float(metrics["criterion"]) == (0.0 if bound is released else 1.0)
        train_key = jax.random.split(key)[1]
        labels = np.asarray(before.assignment)
        moved = [c for c in range(CLIENTS) if labels[c] != 0]
        assert moved  # clients outside cluster 0, whose own model is not the criterion
        for c in moved[:3]:
            if bound is released:
                want = _gradient(model, _model(before.models, labels[c]), data, train_key, c)
            else:
                want = _gradient(model, _model(before.models, 1), data,
                                 jax.random.fold_in(train_key, 1), c)
            block = 0 if bound is released else 1
            np.testing.assert_allclose(state.profile[block, c], want, atol=1e-6)
        if bound is released:  # (its own model's gradient, not theta_0's)
            other = _gradient(model, _model(before.models, 0), data, train_key, moved[0])
            assert not np.allclose(state.profile[0, moved[0]], other, atol=1e-4)
