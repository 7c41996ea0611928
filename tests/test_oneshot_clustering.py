"""FL+HC and PACFL: their one-shot clusterings against scipy (linkage, principal angles) and
NumPy (SVD) on tiny problems, and the cluster models against per-client loops."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import algorithm as build
from conftest import ragged_dataset
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.linalg import subspace_angles
from scipy.spatial.distance import pdist
from sklearn.metrics import adjusted_rand_score

import mcfl
from mcfl.algorithms.clustered.pacfl import client_subspaces, smallest_angles
from mcfl.algorithms.clustered.shared import flat_models
from mcfl.apps.cli import main
from mcfl.engine import LocalTraining
from mcfl.errors import ConfigError
from mcfl.models import make_model
from tests.reference import reference_local_train


def _client_rows(data, client):
    start, count = int(data.train_offsets[client]), int(data.train_counts[client])
    rows = np.asarray(data.train_order)[start:start + count]
    return np.asarray(data.x_train)[rows].reshape(count, -1)


def test_pacfl_subspaces_and_angles_match_numpy_and_scipy():
    """U_i: the top-p left singular vectors of each client's data matrix (features by
    samples), as NumPy's SVD finds them (the same subspace); the proximity: the smallest
    principal angle in degrees, as scipy.linalg.subspace_angles."""
    data = ragged_dataset([7, 30, 12, 3, 21], num_features=6, seed=2).arrays
    clients = jnp.arange(5, dtype=jnp.int32)
    found = np.asarray(jax.jit(client_subspaces, static_argnums=2)(data, clients, 2))
    assert found.shape == (5, 6, 2)
    for c in range(5):
        u = np.linalg.svd(_client_rows(data, c).T, full_matrices=False)[0][:, :2]
        np.testing.assert_allclose(found[c] @ found[c].T, u @ u.T, atol=1e-4)
    angles = np.asarray(jax.jit(smallest_angles)(jnp.asarray(found)))
    for i in range(5):
        for j in range(5):
            want = np.degrees(subspace_angles(found[i], found[j]).min())
            np.testing.assert_allclose(angles[i, j], want, atol=0.05)


def test_pacfl_clusters_by_average_linkage_of_the_angles():
    """Clients whose features live in one of two different 2-D subspaces of R^6: PACFL's
    start (p = 2) finds the two groups, as scipy's average linkage on the same angles."""
    rng = np.random.default_rng(3)
    bases = [np.linalg.qr(rng.normal(size=(6, 2)))[0] for _ in range(2)]
    group = np.array([0, 1, 1, 0, 1, 0, 0, 1])
    sizes = rng.integers(8, 20, size=8)
    dataset = ragged_dataset(sizes, num_features=6, seed=3)
    x = np.asarray(dataset.arrays.x_train).copy()
    owner = np.repeat(np.arange(8), sizes)  # ragged rows are owner-sorted
    x[np.asarray(dataset.arrays.train_order)] = np.stack(
        [bases[group[o]] @ rng.normal(size=2) for o in owner])
    data = dataset.arrays.replace(x_train=jnp.asarray(x, jnp.float32))
    model = make_model("mclr", (6,), 3)
    training = LocalTraining(model.apply, lr=0.1, batch_size=10)
    algorithm = build("pacfl", model, training, 4, 4, clusters=2, pacfl_vectors=2)
    state = jax.jit(algorithm.init)(data, jax.random.key(0))
    labels = np.asarray(state.assignment)
    assert adjusted_rand_score(group, labels) == 1
    found = np.asarray(client_subspaces(data, jnp.arange(8, dtype=jnp.int32), 2))
    angles = np.array([[np.degrees(subspace_angles(a, b).min()) for b in found] for a in found])
    tree = linkage(angles[np.triu_indices(8, 1)], method="average")
    assert adjusted_rand_score(fcluster(tree, 2, criterion="maxclust"), labels) == 1


def test_flhc_clusters_every_clients_update_by_ward_after_the_warmup():
    """Round 1 (warm-up 1) is FedAvg; round 2 trains every client from the global model and
    clusters the updates by Ward linkage (scipy's clusters); each cluster's model is the
    n_i-weighted mean of its members' trained models."""
    dataset = ragged_dataset([13, 30, 17, 40, 9, 24, 12, 25], seed=4)
    data = dataset.arrays
    model = make_model("mclr", (5,), 3)
    training = LocalTraining(model.apply, lr=0.1, batch_size=10, local_epochs=1)
    algorithm = build("flhc", model, training, 4, 4, clusters=3, flhc_warmup=1)
    state = algorithm.init(data, jax.random.key(1))
    step = jax.jit(algorithm.round)
    state, _ = step(state, data, jax.random.key(2))
    assert np.all(np.asarray(state.assignment) == 0) and int(state.active.sum()) == 1
    w = jax.tree.map(lambda m: m[0], state.models)
    key = jax.random.key(3)
    state, metrics = step(state, data, key)
    train_key = jax.random.split(key)[1]
    trained = np.stack([np.asarray(flat_models(jax.tree.map(
        lambda x: x[None], reference_local_train(training, data, train_key, w, c)[0])))[0]
        for c in range(8)])
    updates = trained - np.asarray(flat_models(jax.tree.map(lambda x: x[None], w)))[0]
    expected = fcluster(linkage(pdist(updates), method="ward"), 3, criterion="maxclust")
    labels = np.asarray(state.assignment)
    assert adjusted_rand_score(expected, labels) == 1
    counts = np.asarray(data.train_counts, np.float64)
    for k in range(3):
        members = labels == k
        center = (counts[members] @ trained[members]) / counts[members].sum()
        np.testing.assert_allclose(np.asarray(flat_models(state.models))[k], center,
                                   atol=1e-5)
    assert float(metrics["num_clusters"]) == 3
    chex.assert_shape(state.assignment, (8,))


def test_settings_that_would_do_nothing_are_refused_in_one_line(tmp_path, capsys):
    """FL+HC's warm-up as long as the run (no clustering round: plain FedAvg) and PACFL's
    p vectors with 2p above the features (every two subspaces share a direction: every angle
    0, the clustering arbitrary) are refused, naming the value and what is allowed."""
    with pytest.raises(ConfigError, match=r"^flhc_warmup=10 leaves no round for FL\+HC's "
                                          r"clustering \(round 11\) in a run of 5 rounds; "
                                          r"allowed: 0 to 4$"):
        mcfl.resolve(mcfl.RunConfig(algorithm="flhc", rounds=5))
    assert mcfl.RunConfig(algorithm="flhc", rounds=5, flhc_warmup=4).params.warmup == 4
    assert main(["run", "--algorithm", "flhc", "--rounds", "3", "--flhc-warmup", "3",
                 "--out", str(tmp_path / "flhc")]) == 2
    assert capsys.readouterr().err == (
        "mcfl: error: flhc_warmup=3 leaves no round for FL+HC's clustering (round 4) in a run "
        "of 3 rounds; allowed: 0 to 2\n")

    # why 2p > d is refused: 4-dimensional subspaces of R^6 always meet (angle 0)
    data = ragged_dataset([7, 30, 12, 3, 21], num_features=6, seed=2).arrays
    subspaces = client_subspaces(data, jnp.arange(5, dtype=jnp.int32), 4)
    np.testing.assert_allclose(np.asarray(smallest_angles(subspaces)), 0, atol=0.5)
    model = make_model("mclr", (6,), 3)
    training = LocalTraining(model.apply, lr=0.1, batch_size=10)
    with pytest.raises(ConfigError) as caught:
        build("pacfl", model, training, 4, 4, clusters=2, pacfl_vectors=4).init(
            data, jax.random.key(0))
    assert str(caught.value) == (
        "pacfl_vectors=4: the data have 6 features, and two subspaces of 4 dimensions in 6 "
        "always share a direction, so every angle PACFL clusters by would be 0; allowed: 1 to 3")
    build("pacfl", model, training, 4, 4, clusters=2, pacfl_vectors=3).init(
        data, jax.random.key(0))  # 3 of 6: accepted
    # through the command line (Synthetic's 60 features): exit code 2, one line
    assert main(["run", "--algorithm", "pacfl", "--pacfl-vectors", "31", "--clients", "4",
                 "--clusters", "2", "--rounds", "1", "--embed-clients", "0",
                 "--out", str(tmp_path / "pacfl")]) == 2
    err = capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    assert err.startswith("mcfl: error: pacfl_vectors=31: the data have 60 features")
    assert err.endswith("allowed: 1 to 30\n") and len(err.splitlines()) == 1
