"""FedGWC (`mcfl.algorithms.clustered.fedgwc`): the engine's recorded step losses and a whole round
against a per-client NumPy loop (Gaussian rewards, interaction matrix, running MSE and patience),
the rewards and the synthetic top-up by hand, the affinity, spectral clustering and Davies-Bouldin
choice against scikit-learn, the patience rule and the split's bookkeeping by hand, planted
clusters found, and bad settings refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conformance_setup import scan
from conftest import algorithm as build
from conftest import planted_gaussian
from reference import reference_batches
from sklearn.cluster import SpectralClustering
from sklearn.manifold import SpectralEmbedding
from sklearn.metrics import adjusted_rand_score, davies_bouldin_score

import mcfl
from mcfl.algorithms.clustered import fedgwc as gwc
from mcfl.algorithms.clustered.shared import cluster_sizes
from mcfl.engine import LocalTraining, RoundClients, Start, train_and_collect
from mcfl.engine.sampling import sample_clients
from mcfl.errors import ConfigError
from mcfl.models import make_model

CLIENTS, PER_ROUND, STEPS, BATCH = 12, 6, 3, 20


@pytest.fixture(scope="module")
def planted():
    return planted_gaussian(CLIENTS, 2, "permuted")


def _model_and_training(steps=STEPS):
    model = make_model("mclr", (12,), 10)
    return model, LocalTraining(model.apply, batch_size=BATCH, lr=0.05, local_steps=steps)


def _stepper(training):
    """(the optimizer, one jitted plain step ``(params, state, x, y) -> (params, state, loss
    before the step)``)."""
    optimizer = training.transform()

    @jax.jit
    def step(p, s, x, y):
        loss, grads = jax.value_and_grad(lambda q: jnp.mean(
            optax.softmax_cross_entropy_with_integer_labels(training.apply_fn(q, x), y)))(p)
        updates, s = optimizer.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    return optimizer, step


def _reference_losses(stepper, training, data, key, params, client: int):
    """(trained params, [steps] the minibatch loss before each step), one step at a time."""
    optimizer, step = stepper
    state = optimizer.init(params)
    losses = []
    for x, y in reference_batches(training, data, key, client):
        params, state, loss = step(params, state, x, y)
        losses.append(float(loss))
    return params, np.asarray(losses)


def test_recorded_step_losses_equal_a_per_client_loop(planted):
    """`LocalTraining.record_losses`: each client's pre-step minibatch losses (0 past its steps),
    their mean the reported loss, and the trained models those of training without recording
    (to float rounding: another program)."""
    model, training = _model_and_training()
    data = planted.arrays
    key = jax.random.key(3)
    params = model.init(jax.random.key(0))
    clients = jnp.arange(4, dtype=jnp.int32)
    selection = RoundClients(clients, jnp.zeros_like(clients))
    start = jax.tree.map(lambda p: p[None], params)
    recorded, stats, _ = train_and_collect(
        Start(start, selection, training=training.replace(record_losses=STEPS + 2)),
        data, key)
    plain, plain_stats, _ = train_and_collect(
        Start(start, selection, training=training),
        data, key)
    stepper = _stepper(training)
    assert plain_stats.step_losses is None
    for c in range(4):
        want_params, want = _reference_losses(stepper, training, data, key, params, c)
        np.testing.assert_allclose(stats.step_losses[c], np.concatenate([want, [0.0, 0.0]]),
                                   rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(stats.loss[c], want.mean(), rtol=2e-5)
        for got, base, ref in zip(jax.tree.leaves(recorded), jax.tree.leaves(plain),
                                  jax.tree.leaves(want_params)):
            np.testing.assert_allclose(got[c], base[c], rtol=1e-6, atol=1e-8)
            np.testing.assert_allclose(got[c], ref, rtol=1e-5, atol=1e-6)


def _numpy_rewards(losses, weights, samples=0, draws=None):
    """Rewards of one cohort (rows of `losses` [m, L]), the code's `_get_gaussian_rewards` in
    float64; `draws` [samples, L] standard normals for the synthetic top-up."""
    losses = np.asarray(losses, np.float64)
    w = np.asarray(weights, np.float64) / np.sum(weights)
    mu = w @ losses
    s2 = w @ (losses - mu) ** 2
    m = losses.shape[0]
    if samples > m:
        rows = np.concatenate([draws[:samples - m] * np.sqrt(s2) + mu, losses])
        mu, s2 = rows.mean(0), rows.var(0, ddof=1)
    s2 = s2 + 1e-16
    return np.exp(-0.5 * (losses - mu) ** 2 / s2).mean(1)


def test_gaussian_rewards_by_hand():
    """Two cohorts (clusters 0 and 2) in one call, one client outside any cohort: the code's
    weighted mean and variance per step; identical curves give 1; the top-up with S = 5 draws
    S - m synthetic rows per cluster (the same normals as the function's)."""
    losses = np.array([[2.0, 1.5, 1.0], [2.2, 1.4, 1.3], [1.0, 0.5, 0.2], [0.7, 0.7, 0.7],
                       [0.7, 0.7, 0.7], [0.7, 0.7, 0.7], [9.0, 9.0, 9.0]], np.float32)
    weights = np.array([10, 30, 20, 5, 5, 7, 1], np.float32)
    segments = np.array([0, 0, 0, 2, 2, 2, 1], np.int32)
    cohort = np.array([1, 1, 1, 1, 1, 1, 0], bool)
    valid = np.ones(losses.shape, bool)
    key = jax.random.key(0)
    args = (jnp.asarray(losses), jnp.asarray(valid), jnp.asarray(weights),
            jnp.asarray(segments), jnp.asarray(cohort), 3)
    found = np.asarray(gwc.gaussian_rewards(*args, 0, key))
    np.testing.assert_allclose(found[:3], _numpy_rewards(losses[:3], weights[:3]), rtol=1e-5)
    assert found[3:6].tolist() == [1.0, 1.0, 1.0] and found[6] == 0.0
    # client 0 by hand: per step the n_i-weighted mean and variance over clients 0, 1, 2
    kernels = []
    for t in range(3):
        mu = (10 * losses[0, t] + 30 * losses[1, t] + 20 * losses[2, t]) / 60
        s2 = sum(n * (losses[c, t] - mu) ** 2 for c, n in ((0, 10), (1, 30), (2, 20))) / 60
        kernels.append(np.exp(-0.5 * (losses[0, t] - mu) ** 2 / s2))
    assert found[0] == pytest.approx(np.mean(kernels), rel=1e-5)
    topped = np.asarray(gwc.gaussian_rewards(*args, 5, key))
    draws = np.asarray(jax.random.normal(key, (3, 5, 3)), np.float64)
    # the function shifts the losses by the cohort's smallest (rewards do not change)
    for rows, cluster in ((slice(0, 3), 0), (slice(3, 6), 2)):
        shift = losses[rows].min(0)
        want = _numpy_rewards(losses[rows] - shift, weights[rows], 5, draws[cluster])
        np.testing.assert_allclose(topped[rows], want, rtol=1e-4)
    assert not np.allclose(topped[:3], found[:3])


def _two_cluster_state(bound, data, rng):
    """The state after init with clusters 0 (even clients) and 1 (odd), slot 2 free, a random
    interaction matrix, running MSEs and patience counters."""
    state = jax.jit(bound.init)(data, jax.random.key(0))
    assignment = jnp.asarray(np.arange(CLIENTS) % 2, jnp.int32)
    other = jax.tree.map(lambda m: m[0] + 0.01, state.clusters.models)
    models = jax.tree.map(lambda m, o: m.at[1].set(o), state.clusters.models, other)
    clusters = state.clusters.replace(models=models, assignment=assignment,
                                      active=jnp.array([True, True, False]),
                                      sizes=cluster_sizes(assignment, 3))
    return state.replace(clusters=clusters,
                         interaction=jnp.asarray(rng.uniform(0, 0.1, (CLIENTS, CLIENTS)),
                                                 jnp.float32),
                         mse=jnp.array([0.5, 2e-3, 1.0]), patience=jnp.array([3, 0, 0]))


def test_a_round_equals_a_per_client_reference(planted):
    """One round from two clusters: the sampled clients' losses by a per-client loop, their
    rewards per cluster, every pair's interaction entry, the running MSEs and the patience
    (cluster 1 stable: one more; cluster 0 not: reset) in float64 NumPy; the clusters' models
    are their members' n_i-weighted means."""
    model, training = _model_and_training()
    data = planted.arrays
    bound = build("fedgwc", model, training, PER_ROUND, 4, 3, fedgwc_loss_samples=0,
                  fedgwc_eps=0.05)
    state = _two_cluster_state(bound, data, np.random.default_rng(0))
    key = jax.random.key(7)
    new, metrics = jax.jit(bound.round)(state, data, key)

    sample_key, train_key = jax.random.split(key)
    clients = np.asarray(sample_clients(sample_key, CLIENTS, PER_ROUND))
    assignment = np.asarray(state.clusters.assignment)
    counts = np.asarray(data.train_counts, np.float64)
    P = np.array(state.interaction, np.float64)
    mse, patience = np.array(state.mse, np.float64), np.array(state.patience)
    stepper = _stepper(training)
    for k in (0, 1):
        cohort = [int(c) for c in clients if assignment[c] == k]
        start = jax.tree.map(lambda m, k=k: m[k], state.clusters.models)
        trained, losses = zip(*(_reference_losses(stepper, training, data, train_key, start,
                                                  c) for c in cohort))
        rewards = _numpy_rewards(np.stack(losses), counts[cohort])
        alpha = len(cohort) / np.sum(assignment == k)
        sse = 0.0
        for i, r in zip(cohort, rewards):
            for j in cohort:
                old = P[i, j]
                P[i, j] = (1 - alpha) * old + alpha * r / rewards.sum()
                sse += (P[i, j] - old) ** 2
        mse[k] = (1 - alpha) * mse[k] + alpha * sse / len(cohort) ** 2
        patience[k] = patience[k] + 1 if mse[k] < 0.05 else 0
        w = counts[cohort] / counts[cohort].sum()
        for got, *leaves in zip(jax.tree.leaves(new.clusters.models), *map(jax.tree.leaves,
                                                                           trained)):
            np.testing.assert_allclose(got[k], sum(wi * x for wi, x in zip(w, leaves)),
                                       rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new.interaction, P, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(new.mse, mse, rtol=1e-4)
    assert np.asarray(new.patience).tolist() == patience.tolist() == [0, 1, 0]
    assert metrics["splits"] == 0 and metrics["num_clusters"] == 2


def _planted_interaction(rng, groups, members, noise=0.02):
    """[C, C] an interaction matrix whose columns (perception vectors) follow the clients'
    `groups`, 0 outside the `members`."""
    profile = rng.uniform(0, 1, (groups.max() + 1, groups.size))  # [group, row k]
    P = profile[groups].T + noise * rng.normal(size=(groups.size, groups.size))
    return np.where(members[:, None] & members[None, :], P, 0.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_affinity_spectral_clustering_and_db_equal_sklearns(seed):
    """The affinity by the code's pairwise loop, then for n = 2..4 scikit-learn's
    SpectralClustering (cluster_qr) labels and the Davies-Bouldin index on its
    SpectralEmbedding: the same partitions (n = 3 the planted groups), the same indices, the
    same choice (Davies-Bouldin prefers n = 2 here). Two of the 16 clients are outside the
    cluster."""
    rng = np.random.default_rng(seed)
    groups = np.repeat([0, 1, 2], [6, 5, 5])
    members = np.ones(16, bool)
    members[[3, 12]] = False
    P = _planted_interaction(rng, groups, members, noise=0.15)
    gamma = 0.5
    # the code's `_compute_P` on the members' block
    block = P[np.ix_(members, members)].T
    block = (block - block.min()) / max(block.max() - block.min(), 1e-8)
    n = block.shape[0]
    want = np.zeros((n, n))
    for i in range(n - 1):
        for j in range(i + 1, n):
            keep = [k for k in range(n) if k not in (i, j)]
            want[i, j] = want[j, i] = np.exp(-gamma * np.sum((block[i, keep] - block[j, keep])
                                                              ** 2))
    found = np.asarray(gwc.affinity(jnp.asarray(P, jnp.float32), jnp.asarray(members), gamma))
    np.testing.assert_allclose(found[np.ix_(members, members)], want, rtol=1e-5, atol=1e-6)
    assert not found[~members].any() and not found[:, ~members].any()

    best_split = jax.jit(gwc.best_split, static_argnums=4)
    labels, index, scores = best_split(jnp.asarray(P, jnp.float32), jnp.asarray(members),
                                       gamma, 4, 4)
    labels_of = jax.jit(lambda a, m, k: gwc.cluster_qr(gwc.spectral_vectors(a, m, k)),
                        static_argnums=2)
    expected = []
    for k in (2, 3, 4):
        sk = SpectralClustering(k, n_components=k, affinity="precomputed",
                                assign_labels="cluster_qr", random_state=0).fit_predict(want)
        emb = SpectralEmbedding(k, affinity="precomputed", random_state=0).fit_transform(want)
        expected.append(davies_bouldin_score(emb, sk))
        mine = np.asarray(labels_of(jnp.asarray(found), jnp.asarray(members), k))[members]
        assert adjusted_rand_score(sk, mine) == 1.0, k
        if k == 3:  # the planted groups
            assert adjusted_rand_score(groups[members], mine) == 1.0
    np.testing.assert_allclose(scores, expected, rtol=2e-3)
    best = int(np.argmin(expected))
    assert expected[best] < 1.0 and float(index) == pytest.approx(expected[best], rel=2e-3)
    chosen = SpectralClustering(best + 2, n_components=best + 2, affinity="precomputed",
                                assign_labels="cluster_qr", random_state=0).fit_predict(want)
    assert adjusted_rand_score(chosen, np.asarray(labels)[members]) == 1.0
    # only n <= 2 allowed: the index of n = 2, the others out
    _, _, capped = best_split(jnp.asarray(P, jnp.float32), jnp.asarray(members), gamma, 2, 4)
    assert np.isfinite(capped[0]) and np.isinf(capped[1:]).all()


def test_davies_bouldin_equals_sklearns_with_an_empty_label():
    rng = np.random.default_rng(0)
    points = rng.normal(size=(10, 3)).astype(np.float32)
    labels = np.array([0, 0, 3, 3, 3, 1, 1, 0, 3, 1])  # label 2 unused
    members = np.ones(10, bool)
    members[4] = False
    found = gwc.davies_bouldin(jnp.asarray(points), jnp.asarray(labels), jnp.asarray(members), 4)
    assert float(found) == pytest.approx(davies_bouldin_score(points[members],
                                                              labels[members]), rel=1e-5)
    one = gwc.davies_bouldin(jnp.asarray(points), jnp.zeros(10, jnp.int32),
                             jnp.asarray(members), 4)
    assert np.isinf(one)  # scikit-learn refuses one label


def test_patience_rule_by_hand():
    """upsilon <- (1 - a) upsilon + a sse / m^2 for the clusters updated; the patience counts
    the rounds in a row under eps and restarts at 0 above it; the others stay."""
    mse, patience = jnp.array([1.0, 0.01, 0.3]), jnp.array([0, 2, 5], jnp.int32)
    alpha = jnp.array([0.5, 0.25, 0.5])
    sse = jnp.array([0.0, 0.0, 1.0])
    sizes = jnp.array([2, 4, 1])
    updated = jnp.array([True, True, False])
    seen = []
    for _ in range(3):
        mse, patience = gwc.stability(mse, patience, alpha, sse, sizes, 0.2, updated)
        seen.append((np.asarray(mse, np.float64).round(6).tolist(), np.asarray(patience).tolist()))
    assert seen == [([0.5, 0.0075, 0.3], [0, 3, 5]), ([0.25, 0.005625, 0.3], [0, 4, 5]),
                    ([0.125, 0.004219, 0.3], [1, 5, 5])]
    # a round's MSE divides by the cohort squared: 4 changes of 0.1 over m = 2
    mse, patience = gwc.stability(jnp.array([0.0]), jnp.array([3]), jnp.array([1.0]),
                                  jnp.array([0.04]), jnp.array([2]), 0.005, jnp.array([True]))
    assert float(mse[0]) == pytest.approx(0.01) and int(patience[0]) == 0


def test_clustering_is_due_when_the_patience_reaches_n_over_s_and_all_clients_never_split(
        planted):
    """With every client every round the perception vectors are all the same: the clustering
    runs at round pi* = round(N / S) = 1 and refuses (upsilon back to 1); with half the
    clients a round, pi* = 2."""
    model, training = _model_and_training(steps=1)
    data = planted.arrays
    for per_round, due in ((CLIENTS, 0), (CLIENTS // 2, 1)):
        bound = build("fedgwc", model, training, per_round, 4, 3, fedgwc_eps=10.0,
                      fedgwc_loss_samples=0)
        state = jax.jit(bound.init)(data, jax.random.key(0))
        _, stacked = scan(bound, state, data, jax.random.key(1), 0, 3)
        reset = np.asarray(stacked["interaction_mse"]) == 1.0
        assert np.flatnonzero(reset).tolist() == [due], stacked["interaction_mse"]
        if per_round == CLIENTS:
            assert np.asarray(stacked["num_clusters"]).tolist() == [1.0, 1.0, 1.0]


def test_a_split_takes_the_free_slots_and_copies_the_parents_model(planted):
    """Cluster 1 of slots [0, 1, 2, 3] (0 and 1 in use) splits its 3 planted groups: the
    first label keeps slot 1, the others take the free slots 2 and 3 with copies of model 1,
    upsilon 1 and patience 0; cluster 0 is untouched. With one free slot only two clusters
    are allowed (and refused for three groups, where their index is >= 1)."""
    model, training = _model_and_training()
    bound = build("fedgwc", model, training, PER_ROUND, 4, 4, fedgwc_split_share=0.05)
    data = planted.arrays
    state = jax.jit(bound.init)(data, jax.random.key(0))
    rng = np.random.default_rng(3)
    assignment = np.array([0, 0, 0, 0] + [1] * 8)
    groups = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 0, 0])  # within cluster 1: 3 groups
    members = assignment == 1
    P = _planted_interaction(rng, groups, members)
    models = jax.tree.map(lambda m: m.at[1].add(1.0), state.clusters.models)
    clusters = state.clusters.replace(models=models, assignment=jnp.asarray(assignment),
                                      active=jnp.array([True, True, False, False]),
                                      sizes=cluster_sizes(jnp.asarray(assignment), 4))
    state = state.replace(clusters=clusters, interaction=jnp.asarray(P, jnp.float32),
                          mse=jnp.array([0.3, 1e-6, 1.0, 1.0]),
                          patience=jnp.array([2, 2, 0, 0]))
    params = bound.hp.params
    due = jnp.array([False, True, False, False])
    split, count = gwc.split_due(state, due, params, 1)
    got = np.asarray(split.clusters.assignment)
    assert int(count) == 1 and got[:4].tolist() == [0, 0, 0, 0]
    assert adjusted_rand_score(groups[members], got[members]) == 1.0
    assert sorted(set(got[members].tolist())) == [1, 2, 3]
    assert np.asarray(split.clusters.active).tolist() == [True] * 4
    sizes = np.asarray(split.clusters.sizes)
    assert sizes[0] == 4 and sorted(sizes[1:]) == [2, 3, 3]
    for leaf, before in zip(jax.tree.leaves(split.clusters.models),
                            jax.tree.leaves(state.clusters.models)):
        for slot in (1, 2, 3):
            np.testing.assert_array_equal(leaf[slot], before[1])
        np.testing.assert_array_equal(leaf[0], before[0])
    assert np.asarray(split.mse).tolist() == [pytest.approx(0.3), 1.0, 1.0, 1.0]
    assert np.asarray(split.patience).tolist() == [2, 0, 0, 0]
    # one free slot (3): n = 2 at most; cluster 1 of two groups this time
    halves = np.array([0] * 4 + [0, 1] * 4)
    crowded = state.replace(
        clusters=state.clusters.replace(active=jnp.array([True, True, True, False])),
        interaction=jnp.asarray(_planted_interaction(rng, halves, members), jnp.float32))
    split, count = gwc.split_due(crowded, due, params, 1)
    got = np.asarray(split.clusters.assignment)
    assert int(count) == 1 and sorted(set(got[members].tolist())) == [1, 3]
    assert adjusted_rand_score(halves[members], got[members]) == 1.0
    # three groups, two clusters allowed: Davies-Bouldin >= 1, no split, upsilon back to 1
    state = crowded.replace(interaction=state.interaction)
    kept, count = gwc.split_due(state, due, params, 1)
    assert int(count) == 0 and float(kept.mse[1]) == 1.0
    assert np.asarray(kept.clusters.assignment).tolist() == assignment.tolist()


def test_planted_clusters_are_split_apart(planted):
    """24 clients, half of them (one planted group) with random training labels: losses far
    apart. Six clients a round, at most 2 clusters a split (m = 12): after the interaction
    matrix has settled, one split, and it separates the groups."""
    data = planted_gaussian(24, 2, "permuted")
    arrays = data.arrays
    truth = np.asarray(data.true_cluster)
    owner = np.minimum(np.asarray(arrays.train_owner), 23)
    y = np.asarray(arrays.y_train).copy()
    noisy = truth[owner] == 1
    y[noisy] = np.random.default_rng(0).integers(0, 10, noisy.sum())
    arrays = arrays.replace(y_train=jnp.asarray(y, arrays.y_train.dtype))
    model, training = _model_and_training(steps=2)
    bound = build("fedgwc", model, training, 6, 8, 2, fedgwc_eps=1e-3, fedgwc_loss_samples=0,
                  fedgwc_split_share=0.5)
    state = jax.jit(bound.init)(arrays, jax.random.key(2))
    final, stacked = scan(bound, state, arrays, jax.random.key(3), 0, 400)
    splits = np.flatnonzero(np.asarray(stacked["splits"]))
    assert len(splits) == 1 and stacked["num_clusters"][-1] == 2
    assert adjusted_rand_score(truth, np.asarray(final.clusters.assignment)) > 0.8


@pytest.mark.parametrize("changes, message", [
    ({"fedgwc_gamma": 0.0}, "fedgwc_gamma"),
    ({"fedgwc_eps": -1.0}, "fedgwc_eps"),
    ({"fedgwc_loss_samples": -1}, "fedgwc_loss_samples must be an integer >= 0"),
    ({"fedgwc_max_split": 1}, "fedgwc_max_split must be an integer >= 2"),
    ({"fedgwc_split_share": 1.5}, "fedgwc_split_share"),
    ({"fedgwc_db_threshold": 0.0}, "fedgwc_db_threshold"),
    ({"dp_clip": 1.0, "dp_noise": 1.0}, "fedgwc"),
])
def test_bad_settings_are_one_line_config_errors(changes, message):
    with pytest.raises(ConfigError, match=message) as refused:
        mcfl.resolve(mcfl.RunConfig(algorithm="fedgwc", **changes))
    assert "\n" not in str(refused.value)
