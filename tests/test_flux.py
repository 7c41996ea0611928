"""FLUX (`mcfl.algorithms.clustered.flux`) and its density clustering (`mcfl.clustering.density`)
against scikit-learn's DBSCAN, scipy's connected components, hand-computed knees and a per-client
NumPy loop of the descriptors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import planted_gaussian
from scipy.sparse.csgraph import connected_components
from sklearn.cluster import DBSCAN
from sklearn.metrics import adjusted_rand_score

import mcfl
from mcfl.algorithms.clustered import flux as flux_module
from mcfl.clustering.density import components, dbscan_components, knee_radius
from mcfl.models import make_model


@pytest.mark.parametrize("seed", range(4))
def test_components_equal_scipys(seed):
    rng = np.random.default_rng(seed)
    upper = np.triu(rng.random((30, 30)) < 0.05, 1)
    graph = upper | upper.T | np.eye(30, dtype=bool)
    _, expected = connected_components(graph, directed=False)
    found = np.asarray(components(jnp.asarray(graph)))
    assert adjusted_rand_score(expected, found) == 1.0
    firsts = [int(np.flatnonzero(found == c)[0]) for c in range(found.max() + 1)]
    assert firsts == sorted(firsts)  # numbered by first point


@pytest.mark.parametrize("seed", range(4))
def test_dbscan_with_two_samples_equals_sklearns_with_noise_as_singletons(seed):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 4, (3, 2))
    points = np.concatenate([centres[i] + rng.normal(0, 0.3, (8, 2)) for i in range(3)]
                            + [rng.uniform(-12, 12, (4, 2))]).astype(np.float32)
    eps = 0.8
    labels = DBSCAN(eps=eps, min_samples=2).fit(points).labels_.copy()
    noise = labels < 0
    labels[noise] = labels.max() + 1 + np.arange(noise.sum())  # FLUX: each its own cluster
    found = np.asarray(dbscan_components(jnp.asarray(points), jnp.float32(eps)))
    assert adjusted_rand_score(labels, found) == 1.0


def test_the_knee_radius_by_hand():
    # one point per nearest-neighbour distance: a chain whose gaps are the distances
    gaps = np.array([0.1, 0.1, 0.1, 0.2, 1.0, 3.0])
    positions = np.concatenate([[0.0], np.cumsum(gaps)])
    distances = np.abs(positions[:, None] - positions[None, :])
    # nearest: [.1, .1, .1, .1, .2, 1, 3] sorted; scaled x = i/6, y = (d - .1)/2.9;
    # x - y = [0, .167, .333, .5, .632, .356, 0] -> the knee is the fifth, 0.2
    assert float(knee_radius(jnp.asarray(distances))) == pytest.approx(0.2)
    flat = np.abs(np.arange(5.0)[:, None] - np.arange(5.0)[None, :])
    assert float(knee_radius(jnp.asarray(flat))) == pytest.approx(1.0)


def test_descriptors_equal_a_per_client_loop():
    data = planted_gaussian(6, 2).arrays
    model = make_model("mclr", (12,), 10)
    params = model.init(jax.random.PRNGKey(0))
    projection = jnp.linalg.qr(jax.random.normal(jax.random.PRNGKey(1), (12, 10)))[0]
    clients = jnp.arange(6, dtype=jnp.int32)
    found = np.asarray(flux_module.descriptors(model.apply, data, params, projection, clients,
                                               10))
    assert found.shape == (6, 2 * 10 + 2 * 100)
    x, y = np.asarray(data.x_train, np.float64), np.asarray(data.y_train)
    offsets, counts = np.asarray(data.train_offsets), np.asarray(data.train_counts)
    for c in range(6):  # MCLR's one dense layer: its input is the row itself
        rows = slice(offsets[c], offsets[c] + counts[c])
        z, labels = x[rows] @ np.asarray(projection, np.float64), y[rows]
        parts = [z.mean(0), z.std(0)]
        means, stds = [], []
        for k in range(10):
            zk = z[labels == k]
            means.append(zk.mean(0) if len(zk) > 1 else np.full(10, -1.0))
            stds.append(zk.std(0) if len(zk) > 1 else np.full(10, -1.0))
        expected = np.concatenate(parts + means + stds)
        np.testing.assert_allclose(found[c], expected, rtol=2e-4, atol=2e-4)


def test_the_latent_is_the_input_of_the_last_dense_layer():
    model = make_model("mlp", (12,), 10, hidden=(7,))
    params = model.init(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 12))
    z = flux_module.penultimate(model.apply, params, x)
    assert z.shape == (5, 7)
    dense = sorted(k for k in params if k.startswith("Dense_"))
    assert np.allclose(z @ params[dense[-1]]["kernel"] + params[dense[-1]]["bias"],
                       model.apply(params, x), atol=1e-5)


def test_capped_clusters_keep_the_largest_and_send_the_rest_to_the_nearest():
    points = jnp.asarray([[0.0], [0.1], [0.2], [5.0], [9.0], [10.0], [10.1]])
    labels = jnp.asarray([0, 0, 0, 1, 2, 3, 3])
    final, centroids, found = flux_module.capped_clusters(points, labels, 2)
    assert int(found) == 4
    # kept: cluster 0 (3 points) then 3 (2 points); 5.0 joins the first, 9.0 the second
    assert np.asarray(final).tolist() == [0, 0, 0, 0, 1, 1, 1]
    # (the kept centroids 0.1 and 10.05 decide: 5.0 is 4.9 from the first, 5.05 from the second)
    np.testing.assert_allclose(np.asarray(centroids)[:, 0], [5.3 / 4, 29.1 / 3], rtol=1e-5)


def test_flux_clusters_once_after_the_warmup():
    data = planted_gaussian(24, 3)  # P(Y|X): label permutations
    config = mcfl.RunConfig(dataset="digits", algorithm="flux", clusters=6, clients=24,
                            rounds=4, eval_every=2, lr=0.05, seed=0, flux_warmup_rounds=2)
    result = mcfl.run(config, dataset=data)
    found = [row["clusters_found"] for row in result.rounds]
    assert found[0] == 1 and found[1] >= 3 and found[1] == found[-1]  # one clustering only
    assert result.rounds[0]["num_clusters"] == 1
    last = result.rounds[-1]
    assert last["accuracy_micro"] > 0.9 and last["cluster_ari"] > 0.5


def test_flux_serves_newcomers_of_a_feature_shift_their_groups_cluster():
    """Under P(X) shift the label-free half of the descriptor tells the groups apart: every
    held-out client is served a cluster of its own group's training clients (ARI 1). (Under
    P(Y|X) it cannot: the features are the same in every group.)"""
    config = mcfl.RunConfig(dataset="digits", partition="shift_x:3@1", algorithm="flux",
                            clusters=6, clients=24, rounds=2, eval_every=2, lr=0.1, seed=0,
                            flux_warmup_rounds=1, unseen_share=0.25)
    last = mcfl.run(config).rounds[-1]
    assert last["unseen_cluster_ari"] == pytest.approx(1.0)
