"""FedEM's synthetic mixture dataset (`mcfl.data.fedem_synthetic`): the authors' recipe, its
labels as the generating process makes them, and one-line errors for bad settings."""

import numpy as np
import pytest

import mcfl
from mcfl import load_dataset as build_dataset
from mcfl.config import RunConfig
from mcfl.data import fedem_synthetic
from mcfl.data.fedem_synthetic import generate_fedem_synthetic, label_shares, row_components
from mcfl.errors import ConfigError, DataError
from mcfl.runtime.memory import data_bytes


def _draws(seed, clients, components=3, dimension=150):
    """The generator's first draws, made again: sizes, mixture weights, components."""
    rng = np.random.default_rng(seed)
    sizes = np.minimum(rng.lognormal(4.0, 2.0, clients).astype(np.int64) + 50, 1000)
    weights = rng.dirichlet(np.full(components, 0.4), clients)
    return sizes, weights, rng.uniform(-1.0, 1.0, (components, dimension))


def test_the_components_of_the_rows_by_hand():
    # counts (3, 5, 2): the released generator writes component 0 over rows 0-2, then 1 over
    # rows 0-4, then 2 over rows 0-1; rows 5-9 keep the label 0.
    np.testing.assert_array_equal(row_components([3, 5, 2], "released"),
                                  [2, 2, 1, 1, 1, -1, -1, -1, -1, -1])
    np.testing.assert_array_equal(row_components([3, 5, 2], "described"),
                                  [0, 0, 0, 1, 1, 1, 1, 1, 2, 2])
    np.testing.assert_allclose(label_shares([[0.5, 0.4, 0.1]], "released"), [[0.1, 0.3, 0.1]])
    np.testing.assert_allclose(label_shares([[0.5, 0.4, 0.1]], "described"), [[0.5, 0.4, 0.1]])


def test_the_authors_recipe_sizes_and_ground_truth():
    data = generate_fedem_synthetic(4, seed=3, labels="released")
    sizes, weights, _ = _draws(3, 4)
    np.testing.assert_array_equal(data.train_counts(), sizes)  # min(lognormal + 50, 1000)
    np.testing.assert_array_equal(data.test_counts(), [5000] * 4)  # their n_test
    assert data.num_clients == 4 and data.num_classes == 2 and data.feature_shape == (150,)
    x = np.asarray(data.arrays.x_train)
    assert -1.0 <= x.min() and x.max() < 1.0  # uniform on the box [-1, 1]
    assert set(np.unique(np.asarray(data.arrays.y_test))) <= {0, 1}
    # dominant component: the largest share of rows a component labels (released rule)
    np.testing.assert_array_equal(data.true_cluster,
                                  label_shares(weights, "released").argmax(axis=1))
    described = generate_fedem_synthetic(4, seed=3, labels="described")
    np.testing.assert_array_equal(described.true_cluster, weights.argmax(axis=1))

    split = generate_fedem_synthetic(5, seed=3, test_fraction=0.2)
    sizes, _, _ = _draws(3, 5)
    np.testing.assert_array_equal(split.train_counts(), sizes)  # training rows as theirs
    np.testing.assert_array_equal(split.test_counts(), np.maximum(np.rint(sizes / 4), 1))


def test_seeded_and_independent_of_the_generation_chunk(monkeypatch):
    a = generate_fedem_synthetic(6, seed=2, test_fraction=0.3)
    monkeypatch.setattr(fedem_synthetic, "_CHUNK", 7)
    b = generate_fedem_synthetic(6, seed=2, test_fraction=0.3)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a.arrays, name), getattr(b.arrays, name))
    c = generate_fedem_synthetic(6, seed=4, test_fraction=0.3)
    assert not np.array_equal(np.asarray(c.arrays.x_train[:5]), np.asarray(a.arrays.x_train[:5]))


@pytest.mark.parametrize("labels", ["released", "described"])
def test_one_component_labels_are_its_halfspace(labels):
    # One component and no noise: every row is labelled 1 exactly when x . theta > 0.
    data = generate_fedem_synthetic(5, seed=7, test_fraction=0.5, num_components=1,
                                    noise_level=0.0, labels=labels)
    _, _, theta = _draws(7, 5, components=1)
    for x, y in ((data.arrays.x_train, data.arrays.y_train),
                 (data.arrays.x_test, data.arrays.y_test)):
        logit = np.asarray(x, np.float64) @ theta[0]
        clear = np.abs(logit) > 1e-4  # (float32 rows: leave out the boundary)
        np.testing.assert_array_equal(np.asarray(y)[clear], (logit > 0)[clear])


@pytest.mark.parametrize("labels", ["released", "described"])
def test_labels_follow_the_mixture_weights(labels):
    # Without noise a client's labels agree with its dominant component's halfspace on the rows
    # that component labels, and by chance (half) elsewhere. Mixture weights ignored (each
    # component a third of the rows) would leave a dominant client at about 2/3 agreement.
    clients = 60
    data = generate_fedem_synthetic(clients, seed=11, test_fraction=0.5, noise_level=0.0,
                                    labels=labels)
    _, weights, theta = _draws(11, clients)
    shares = label_shares(weights, labels)
    x, y = np.asarray(data.arrays.x_test, np.float64), np.asarray(data.arrays.y_test)
    owner = np.asarray(data.arrays.test_owner)
    agree = (x @ theta.T > 0) == y[:, None]  # [rows, components]
    dominant = shares.max(axis=1) > 0.9
    rows = dominant[owner]
    assert rows.sum() > 1000
    mine = agree[rows, shares.argmax(axis=1)[owner[rows]]].mean()
    top = shares.max(axis=1)[owner[rows]]
    assert mine > 0.85 and abs(mine - np.mean(top + 0.5 * (1 - top))) < 0.03
    # a component with almost no share agrees by chance only
    minor = shares.argmin(axis=1)
    rare = (shares.min(axis=1) < 0.02)[owner] & dominant[owner]
    assert abs(agree[rare, minor[owner[rare]]].mean() - 0.5) < 0.1
    # the released rule leaves rows past the largest count at 0: fewer 1s than a half
    ones = np.asarray(data.arrays.y_train).mean()
    predicted = 0.5 * np.average(shares.sum(axis=1), weights=data.train_counts())
    assert abs(ones - predicted) < 0.03
    assert (ones < 0.45) == (labels == "released")


def test_a_run_config_builds_it_with_its_defaults():
    config = RunConfig(dataset="fedem-synthetic")
    assert config.clients == 300  # the paper's
    assert RunConfig(dataset="synthetic").clients == 100
    small = RunConfig(dataset="fedem-synthetic", clients=3, seed=5, test_fraction=0.25)
    built = build_dataset(small)
    made = generate_fedem_synthetic(3, seed=5, test_fraction=0.25)
    np.testing.assert_array_equal(built.arrays.x_test, made.arrays.x_test)
    np.testing.assert_array_equal(built.true_cluster, made.true_cluster)
    other = build_dataset(small.replace(data_seed=6))
    assert not np.array_equal(np.asarray(other.arrays.y_train), np.asarray(made.arrays.y_train))
    need = data_bytes(mcfl.resolve(config).data)
    rows = fedem_synthetic.row_count(300, 0)
    assert rows > 300 * 5000 and need.device > rows * 600  # 150 float32 features a row


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(num_clients=0), DataError, "needs at least 1 client, got 0"),
    (dict(num_clients=2, alpha=0.0), DataError, "alpha must be > 0"),
    (dict(num_clients=2, num_components=0), DataError, "at least 1 component"),
    (dict(num_clients=2, test_fraction=1.0), DataError, r"must be a number in \(0, 1\)"),
    (dict(num_clients=2, labels="mine"), DataError, "labels must be one of described"),
])
def test_bad_generator_settings_are_one_line(kwargs, error, message):
    with pytest.raises(error, match=message) as caught:
        generate_fedem_synthetic(**kwargs)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("values, message", [
    (dict(clients=0), "clients"),
    (dict(partition="iid"), "comes split by its own users"),
    (dict(samples_per_client=10), "samples_per_client applies to datasets split over"),
    (dict(test_fraction=1.5), "test_fraction"),
])
def test_bad_run_settings_are_one_line(values, message):
    with pytest.raises(ConfigError, match=message) as caught:
        RunConfig(dataset="fedem-synthetic", **values)
    assert "\n" not in str(caught.value)
