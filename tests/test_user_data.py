"""Data users bring: their clients' rows (`from_clients`, `from_arrays`), planted clusters on
any dataset (`plant`, `label_swap:R`), the dataset registry and import paths, and the
`dataset_args` setting, from Python and from the command line."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mcfl
from mcfl.apps.cli import main
from mcfl.data import (
    DATA_FIELDS,
    LabelledArrays,
    from_arrays,
    from_clients,
    partition,
    partition_arrays,
    plant,
    register,
)
from mcfl.data.cache import cache_key
from mcfl.data.spec import parse_partition
from mcfl.errors import ConfigError, DataError
from mcfl.settings import TextParser

RNG = np.random.default_rng


def _blobs(n: int = 60, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n rows of 5 features around one mean per class."""
    rng = RNG(seed)
    y = np.arange(n) % classes
    x = rng.normal(0, 3, (classes, 5))[y] + rng.normal(0, 1, (n, 5))
    return x.astype(np.float32), y


@register("test-user-pooled")
def _pooled(n: int = 60) -> LabelledArrays:
    """Pooled rows: the run splits them over its clients."""
    x, y = _blobs(n)
    return LabelledArrays("pooled", x, y, 3, np.ones(n, bool))


@register("test-user-clients")
def _clients(clients: int = 4) -> mcfl.data.FederatedDataset:
    """Four clients of 15 rows each, already split."""
    x, y = _blobs(15 * clients)
    return from_clients([(x[i::clients], y[i::clients]) for i in range(clients)])


def _rows(split_x, owner, client):
    return np.asarray(split_x)[np.asarray(owner) == client]


# ----------------------------------------------------------------------------------------------
# from_clients / from_arrays


def test_from_clients_splits_each_client_stratified_and_seeded():
    # Client 0: 5 rows of class 0 and 5 of class 1 -> each (client, class) group keeps
    # round(0.8 * 5) = 4 for training: 8 train, 2 test (one of each class). Client 1: 3 rows of
    # class 2 -> round(2.4) = 2 train, 1 test. Client 2: one row -> train only.
    clients = [(np.arange(20.0).reshape(10, 2), [0] * 5 + [1] * 5),
               (np.arange(6).reshape(3, 2), np.array([2, 2, 2])),
               (np.ones((1, 2)), [1])]
    ds = from_clients(clients, client_ids=["a", "b", "c"], seed=3)
    assert ds.client_ids == ("a", "b", "c") and ds.num_classes == 3
    assert ds.train_counts().tolist() == [8, 2, 1] and ds.test_counts().tolist() == [2, 1, 0]
    a = ds.arrays
    assert sorted(np.asarray(a.y_test)[np.asarray(a.test_owner) == 0].tolist()) == [0, 1]
    # every row kept once, by its own client
    rows = np.concatenate([_rows(a.x_train, a.train_owner, 0), _rows(a.x_test, a.test_owner, 0)])
    assert sorted(rows[:, 0].tolist()) == list(range(0, 20, 2))
    assert np.asarray(a.x_train).dtype == np.float32 and ds.feature_shape == (2,)
    again = from_clients(clients, client_ids=["a", "b", "c"], seed=3)
    assert np.array_equal(np.asarray(again.arrays.x_test), np.asarray(a.x_test))


def test_from_clients_with_the_users_split_and_float_labels():
    train = [(np.zeros((3, 2, 2)), [0.0, 1.0, 1.0]), (np.ones((2, 2, 2)), [0, 0])]
    test = [(np.zeros((1, 2, 2)), [4]), ([], [])]  # client 1 has no test rows
    ds = from_clients(train=train, test=test, true_cluster=[1, 0])
    assert ds.train_counts().tolist() == [3, 2] and ds.test_counts().tolist() == [1, 0]
    assert ds.num_classes == 5  # the test label 4 counts
    assert np.asarray(ds.arrays.y_train).tolist() == [0, 1, 1, 0, 0]  # 1.0 is class 1
    assert ds.true_cluster.tolist() == [1, 0] and ds.feature_shape == (2, 2)


def test_from_arrays_groups_rows_by_client():
    x, y = _blobs(30)
    owner = np.arange(30) % 3
    ds = from_arrays(x, y, owner, client_ids=["p", "q", "r"], num_classes=4, test_fraction=0.5)
    assert (ds.train_counts() + ds.test_counts()).tolist() == [10, 10, 10]
    assert ds.num_classes == 4
    held = _rows(ds.arrays.x_train, ds.arrays.train_owner, 1)
    assert all(any(np.array_equal(row, x[j]) for j in range(1, 30, 3)) for row in held)
    x[7, 2] = np.inf  # row 7 is client 1's ('q')
    with pytest.raises(DataError, match=r"^client 'q', row 7: x holds NaN or infinity"):
        from_arrays(x, y, owner, client_ids=["p", "q", "r"])


def _pair(n=4, d=3):
    return np.zeros((n, d)), np.arange(n) % 2


BAD_INPUTS = [
    (lambda: from_clients([]), "clients is an empty list; give one (x, y) pair per client"),
    (lambda: from_clients(np.zeros((2, 3))), "clients must be a list of (x, y) pairs, one per "
     "client, got ndarray"),
    (lambda: from_clients([_pair(), (np.zeros((2, 3)), [0, 1], 7)]),
     "client 1 must be an (x, y) pair of arrays, got a tuple of 3 items"),
    (lambda: from_clients([_pair(), ({"a": 1}, [0])], client_ids=["a", "b"]),
     "client 'b': x must be a numeric array [rows, *features] (integers or floats), got dict"),
    (lambda: from_clients([(np.array([["a", "b"]]), [0])]),
     "client 0: x must be a numeric array [rows, *features] (integers or floats), got dtype <U1"),
    (lambda: from_clients([(np.ones((2, 3), bool), [0, 1])]),
     "client 0: x must be a numeric array [rows, *features] (integers or floats), got dtype "
     "bool; cast 0/1 features with x.astype(np.float32)"),
    (lambda: from_clients([(np.zeros(4), [0, 1, 0, 1])]),
     "client 0: x must be [rows, *features] (at least 2-D), got shape (4,); one feature per row "
     "is shape [rows, 1]"),
    (lambda: from_clients([_pair(), (np.array([[0.0] * 3, [np.nan] * 3]), [0, 1])],
                          client_ids=["a", "b"]),
     "client 'b', row 1: x holds NaN or infinity"),
    (lambda: from_clients([(np.array([[1e39]]), [0])]),
     "client 0, row 0: x holds NaN or infinity (or a value beyond float32's range)"),
    (lambda: from_clients([_pair(), (np.zeros((2, 3)), [0, 1.5])]),
     "client 1, row 1: labels must be integers (class indices), got 1.5"),
    (lambda: from_clients([(np.zeros((2, 3)), [np.nan, 1.0])]),
     "client 0, row 0: labels must be integers (class indices), got nan"),
    (lambda: from_clients([(np.zeros((2, 3)), [True, False])]),
     "client 0: labels must be integers (class indices), got booleans; write the class as 0 or 1"),
    (lambda: from_clients([(np.zeros((2, 3)), ["0", "1"])]),
     "client 0: labels must be integers (class indices), got dtype <U1"),
    (lambda: from_clients([(np.zeros((2, 3)), [0, -1])], client_ids=["z"]),
     "client 'z', row 1: labels must be class indices from 0 to 65535, got -1"),
    (lambda: from_clients([_pair(), (np.zeros((2, 3)), [0, 3])], num_classes=3),
     "client 1: labels must lie in [0, 3) (num_classes=3), got 3"),
    (lambda: from_clients([_pair()], num_classes=0),
     "num_classes must be an integer from 1 to 65536, got 0"),
    (lambda: from_clients([(np.zeros((3, 3)), [0, 1])]),
     "client 0: x has 3 rows but y has 2 labels; give one label per row"),
    (lambda: from_clients([_pair(), (np.zeros((0, 3)), [])], client_ids=["a", "b"]),
     "client 'b' has no rows; every client needs at least one"),
    (lambda: from_clients([_pair(), _pair(d=4)]),
     "client 1: features have shape (4,), but those of client 0 have (3,); every client's "
     "must match"),
    (lambda: from_clients([_pair(), _pair()], true_cluster=[0]),
     "true_cluster must hold one cluster id per client (2), got shape (1,)"),
    (lambda: from_clients([_pair(), _pair()], true_cluster=[0, 0.5]),
     "true_cluster must be integers >= 0 (cluster ids), got [0.0, 0.5]"),
    (lambda: from_clients([_pair(), _pair()], client_ids=["a"]),
     "client_ids must be a list of 2 names, one per client, got a list of 1 items"),
    (lambda: from_clients([_pair(), _pair()], client_ids=["a", "a"]),
     "client_ids names 'a' twice; give every client its own name"),
    (lambda: from_clients([_pair()], test_fraction=1.0),
     "test_fraction must be a number in (0, 1), got 1.0"),
    (lambda: from_clients(train=[_pair()]),
     "give clients=[(x, y), ...] (one pair per client) or both train= and test=; got train= "
     "without test="),
    (lambda: from_clients([_pair()], train=[_pair()], test=[_pair()]),
     "give clients= (split here) or train= and test= (split already), not both"),
    (lambda: from_clients(train=[_pair(), (np.zeros((0, 3)), [])], test=[_pair(), _pair()],
                          client_ids=["a", "b"]),
     "train rows of client 'b' has no rows; every client needs at least one training row"),
    (lambda: from_clients(train=[_pair()], test=[_pair(d=2)]),
     "test rows of client 0: features have shape (2,), but those of the train rows have (3,)"),
    (lambda: from_clients(train=[_pair()], test=[_pair(), _pair()]),
     "train= has 1 clients but test= has 2; give one (x, y) pair per client in each"),
    (lambda: from_arrays(np.zeros((4, 2)), [0, 1, 0, 1], [0, 0, 2, 2]),
     "client 1 has no rows (no entry of client_of_row names it); every client needs at least "
     "one"),
    (lambda: from_arrays(np.zeros((4, 2)), [0, 1, 0, 1], [0, 0, 1, -1]),
     "client_of_row must hold client indices >= 0, got -1 (row 3)"),
    (lambda: from_arrays(np.zeros((4, 2)), [0, 1, 0, 1], [0, 1, 2, 1], client_ids=["a", "b"]),
     "client_of_row must hold client indices in [0, 2) (client_ids lists 2), got 2 (row 2)"),
    (lambda: from_arrays(np.zeros((4, 2)), [0, 1, 0], [0, 0, 1, 1]),
     "from_arrays: x has 4 rows, y 3 labels and client_of_row 4 entries; give one of each per "
     "row"),
    (lambda: from_arrays(np.zeros((3, 2)), [0, 1, 2.5], [0, 1, 1], client_ids=["a", "b"]),
     "client 'b', row 2: labels must be integers (class indices), got 2.5"),
]


@pytest.mark.parametrize("make, message", BAD_INPUTS, ids=range(len(BAD_INPUTS)))
def test_bad_input_is_one_line_naming_the_client(make, message):
    with pytest.raises(DataError) as caught:
        make()
    text = str(caught.value)
    assert text.startswith(message), text
    assert "\n" not in text


# ----------------------------------------------------------------------------------------------
# Planted clusters: label_swap and plant()


def test_label_swap_maps_by_hand():
    # With seed 0 the draws are permutation(4) = [2, 0, 1, 3], then [3, 2, 1, 0]: cluster 1
    # swaps 2 <-> 0 and 1 <-> 3, cluster 2 swaps 3 <-> 2 and 1 <-> 0; cluster 0 keeps labels.
    draws = RNG(0)
    assert draws.permutation(4).tolist() == [2, 0, 1, 3]
    assert draws.permutation(4).tolist() == [3, 2, 1, 0]
    maps = partition.label_swaps(3, 4, RNG(0))
    assert maps.tolist() == [[0, 1, 2, 3], [2, 3, 0, 1], [1, 0, 3, 2]]
    # K odd: permutation(5) = [4, 0, 1, 2, 3] swaps 4 <-> 0 and 1 <-> 2; 3 keeps its label.
    assert RNG(1).permutation(5).tolist() == [4, 0, 1, 2, 3]
    assert partition.label_swaps(2, 5, RNG(1)).tolist() == [[0, 1, 2, 3, 4], [4, 2, 1, 3, 0]]
    many = partition.label_swaps(15, 6, RNG(2))  # all (6-1)!! = 15 pairings but one, distinct
    assert len({m.tobytes() for m in many}) == 15
    assert all((m[m] == np.arange(6)).all() for m in many)  # each its own inverse
    with pytest.raises(DataError, match=r"^label_swap:3 needs 2 distinct pairings of 2 labels "
                                        r"besides the identity; there are only 1$"):
        partition.label_swaps(3, 2, RNG(0))


def test_label_swap_is_a_partition_everywhere():
    assert parse_partition("label_swap:3+dirichlet:0.5") == ("dirichlet", 0.5,
                                                             (("label_swap", None),), 3, ())
    assert str(parse_partition("label_swap:2")) == "label_swap:2+iid"
    with pytest.raises(ConfigError, match="allowed: .*label_swap:R"):
        parse_partition("swap:2")
    x, y = _blobs(80, classes=4)
    arrays = LabelledArrays("blobs", x, y, 4, np.ones(80, bool))
    ds = partition_arrays(arrays, parse_partition("label_swap:2"), 8, 0.25, "none", seed=1)
    assert np.bincount(ds.true_cluster).tolist() == [4, 4]
    # a client of cluster 0 keeps each row's label: find its rows among the originals
    a = ds.arrays
    for client in np.flatnonzero(ds.true_cluster == 0):
        for row, label in zip(_rows(a.x_train, a.train_owner, client),
                              _rows(a.y_train, a.train_owner, client)):
            assert y[np.flatnonzero((x == row).all(axis=1))[0]] == label
    assert mcfl.RunConfig(dataset="digits", partition="label_swap:4").partition == "label_swap:4"


def test_plant_rotates_a_users_images_by_cluster():
    rng = RNG(0)
    clients = [(rng.normal(size=(6, 4, 4)), np.arange(6) % 3) for _ in range(8)]
    ds = from_clients(clients, seed=0)
    planted = plant(ds, "rotated:4", seed=5)
    true = planted.true_cluster
    assert np.bincount(true).tolist() == [2, 2, 2, 2] and planted.name == "user/rotated:4"
    for split in ("train", "test"):
        owner = np.asarray(getattr(ds.arrays, f"{split}_owner"))
        before = np.asarray(getattr(ds.arrays, f"x_{split}"))
        after = np.asarray(getattr(planted.arrays, f"x_{split}"))
        for client in range(8):
            rows = owner == client
            assert np.allclose(after[rows], np.rot90(before[rows], k=true[client], axes=(1, 2)))
        assert np.array_equal(np.asarray(getattr(planted.arrays, f"y_{split}")),
                              np.asarray(getattr(ds.arrays, f"y_{split}")))
    # flat square features turn as images; other shapes are refused in one line
    flat = from_clients([(x.reshape(6, 16), y) for x, y in clients])
    turned = plant(flat, "rotated:4", seed=5)
    client = int(np.flatnonzero(turned.true_cluster == 1)[0])
    rows = np.asarray(flat.arrays.train_owner) == client
    assert np.allclose(np.asarray(turned.arrays.x_train)[rows].reshape(-1, 4, 4),
                       np.rot90(np.asarray(flat.arrays.x_train)[rows].reshape(-1, 4, 4),
                                axes=(1, 2)))
    with pytest.raises(DataError, match=r"^rotated:2 turns square images: features \[H, H\], "
                                        r"\[H, H, C\] or H\*H values; dataset 'user' has "
                                        r"features of shape \(3,\)$"):
        plant(from_clients([_pair(), _pair()]), "rotated:2")
    with pytest.raises(DataError, match="already has planted clusters"):
        plant(planted, "rotated:2")
    with pytest.raises(DataError, match=r"^plant takes planted recipes alone \(rotated:R, "
                                        r"permuted:R, label_swap:R, shift_x:R@S, shift_y:R@S, "
                                        r"shift_y_given_x:R@S, shift_x_given_y:R@S\), got "
                                        r"'dirichlet:0.5'$"):
        plant(ds, "dirichlet:0.5")


def test_plant_label_swap_maps_train_and_test_labels_alike():
    x, y = _blobs(120, classes=4)
    ds = from_arrays(x, y, np.arange(120) % 6)
    planted = plant(ds, "label_swap:3", seed=2)
    rng = RNG(2)  # plant's draws, in its order: the clusters, then the maps
    true = partition.planted_cluster_ids(6, 3, rng)
    maps = partition.label_swaps(3, 4, rng)
    assert np.array_equal(planted.true_cluster, true)
    for split in ("train", "test"):
        owner = np.asarray(getattr(ds.arrays, f"{split}_owner"))
        before = np.asarray(getattr(ds.arrays, f"y_{split}"))
        assert np.array_equal(np.asarray(getattr(planted.arrays, f"y_{split}")),
                              maps[true[owner], before])
        assert np.array_equal(np.asarray(getattr(planted.arrays, f"x_{split}")),
                              np.asarray(getattr(ds.arrays, f"x_{split}")))


# ----------------------------------------------------------------------------------------------
# The registry, import paths and dataset_args


def test_dataset_args_is_a_json_object_setting():
    config = mcfl.RunConfig(dataset="test-user-pooled", dataset_args={"n": 30, "s": (1, 2)})
    assert config.dataset_args == {"n": 30, "s": [1, 2]}  # held as JSON reads it back
    assert "dataset_args" in DATA_FIELDS
    assert mcfl.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert pickle.loads(pickle.dumps(config)) == config and hash(config.data)
    with pytest.raises(TypeError, match="read-only"):
        config.dataset_args["n"] = 3
    assert (cache_key({"dataset_args": config.dataset_args})
            != cache_key({"dataset_args": {"n": 31}}))
    for value, message in [
        ([1], "dataset_args must be a JSON object of names to values"),
        ({1: 2}, "dataset_args must hold JSON values .* under string names, got name 1"),
        ({"x": float("nan")}, "got value nan"),
        ({"x": np.int64(3)}, "got value np.int64\\(3\\)"),
    ]:
        with pytest.raises(ConfigError, match=message):
            mcfl.RunConfig(dataset="test-user-pooled", dataset_args=value)
    with pytest.raises(ConfigError, match="^dataset_args apply to a registered dataset or an "
                                          "import path .*, not 'digits'$"):
        mcfl.RunConfig(dataset="digits", dataset_args={"n": 3})
    parse = TextParser(dict)
    assert parse('{"n": 3}') == {"n": 3}
    with pytest.raises(ConfigError, match="'\\[1\\]' is not a JSON object"):
        parse("[1]")


def test_a_registered_dataset_runs_end_to_end(tmp_path):
    config = mcfl.RunConfig(dataset="test-user-pooled", dataset_args={"n": 90}, clients=3,
                            partition="label_swap:3", rounds=2)
    result = mcfl.run(config)
    assert result.summary["dataset"]["clients"] == 3
    assert result.summary["dataset"]["train_samples"] + result.summary["dataset"][
        "test_samples"] == 90
    assert {c["true_cluster"] for c in result.clients} == {0, 1, 2}
    # clients already split: all of them by default; another count is refused; not cached
    split = mcfl.RunConfig(dataset="test-user-clients", rounds=2)
    assert split.clients is None
    assert mcfl.load_dataset(split).num_clients == 4
    with pytest.raises(DataError, match=r"^dataset 'test-user-clients' returns its 4 clients "
                                        r"already split, but clients is 5: give 4 or leave "
                                        r"clients out$"):
        mcfl.load_dataset(split.replace(clients=5))
    with pytest.raises(DataError, match="its partition may be natural or planted recipes alone"):
        mcfl.load_dataset(split.replace(partition="dirichlet:0.5"))
    planted = mcfl.load_dataset(split.replace(partition="permuted:2"), cache_dir=tmp_path)
    assert sorted(planted.true_cluster.tolist()) == [0, 0, 1, 1]
    assert not list(tmp_path.iterdir())
    with pytest.raises(ConfigError, match=r"^dataset 'test-user-clients' cannot take "
                                          r"dataset_args \{'n': 3\}: got an unexpected"):
        mcfl.load_dataset(split.replace(dataset_args={"n": 3}))


@register("test-user-no-test-rows")
def _no_test_rows() -> mcfl.data.FederatedDataset:
    """Two clients split by the user, with no test rows."""
    x, y = _blobs(20)
    return from_clients(train=[(x[:10], y[:10]), (x[10:], y[10:])], test=[([], []), ([], [])])


def test_a_users_split_without_test_rows_is_told_to_give_some(tmp_path):
    """The advice names what a user's factory can change (its split), not --test-fraction,
    which a dataset split by its factory refuses."""
    with pytest.raises(DataError) as caught:
        mcfl.run(mcfl.RunConfig(dataset="test-user-no-test-rows", rounds=1),
                 out_dir=tmp_path / "run")
    assert str(caught.value) == (
        "the dataset 'user' has no test rows for its 2 client(s); runs are scored on test rows: "
        "have its factory give them test rows (mcfl.data.from_clients(train=..., test=...), or "
        "clients=[...] to split each client's rows)")
    assert not (tmp_path / "run").exists()


def test_a_registered_name_may_not_be_a_built_in_one(monkeypatch):
    from mcfl.data import registry

    with pytest.raises(ValueError, match="without ':'"):
        register("mine:v2")
    monkeypatch.setitem(registry.DATASETS._factories, "digits", _pooled)
    with pytest.raises(ConfigError, match="^dataset 'digits' is built in and also registered"):
        mcfl.RunConfig(dataset="digits")


MODULE = """
import numpy as np
from mcfl.data import from_clients


def load(n=20, clients=3):
    rng = np.random.default_rng(0)
    return from_clients([(rng.normal(size=(n, 4)).astype(np.float32), np.arange(n) % 2)
                         for _ in range(clients)])


def not_data():
    return 7


def nothing_back(n=20):
    rows = np.zeros((n, 4))  # (forgot the return)


def missing_file(n=20):
    return np.loadtxt("/nonexistent-mcfl-dir/sensors.csv")
"""


def test_an_import_path_dataset_runs_from_python(tmp_path, monkeypatch):
    (tmp_path / "user_data_py.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = mcfl.RunConfig(dataset="user_data_py:load", dataset_args={"n": 10, "clients": 2},
                            rounds=2)
    result = mcfl.run(config)
    assert result.summary["dataset"]["clients"] == 2
    assert result.summary["config"]["dataset_args"] == {"n": 10, "clients": 2}
    json.dumps(result.summary)
    with pytest.raises(DataError, match=r"^dataset 'user_data_py:not_data': its factory "
                                        r"returned int; it must return a FederatedDataset"):
        mcfl.load_dataset(mcfl.RunConfig(dataset="user_data_py:not_data", clients=2))
    with pytest.raises(DataError, match=r"^dataset 'user_data_py:nothing_back': its factory "
                                        r"returned NoneType; it must return a FederatedDataset"):
        mcfl.load_dataset(mcfl.RunConfig(dataset="user_data_py:nothing_back", clients=2))
    # a factory that raises: one line naming it, its arguments and the error
    with pytest.raises(DataError) as caught:
        mcfl.load_dataset(mcfl.RunConfig(dataset="user_data_py:missing_file", clients=2,
                                    dataset_args={"n": 5}))
    assert str(caught.value) == (
        "dataset 'user_data_py:missing_file': its factory failed with dataset_args {'n': 5}: "
        "FileNotFoundError: /nonexistent-mcfl-dir/sensors.csv not found.")
    for name, message in [("user_data_py:nothing", "module 'user_data_py' has no attribute "
                                                   "'nothing'"),
                          ("no_such_module_xyz:load", "cannot import 'no_such_module_xyz'")]:
        with pytest.raises(ConfigError, match=message):
            mcfl.RunConfig(dataset=name)


def test_an_import_path_dataset_runs_from_the_command_line(tmp_path, capsys):
    (tmp_path / "user_data_cli.py").write_text(textwrap.dedent(MODULE))
    env = {**os.environ, "MCFL_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    argv = ["run", "--rounds", "1", "--no-compile-cache", "--dataset-args", '{"n": 12}',
            "--out", str(tmp_path / "run")]
    proc = subprocess.run([sys.executable, "-m", "mcfl", *argv, "--dataset",
                           "user_data_cli:load"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dataset"]["clients"] == 3 and summary["config"]["dataset_args"] == {"n": 12}
    # a bad import path: exit code 2 and one line (in this process: the same `main`)
    assert main([*argv, "--dataset", "user_data_nope:load"]) == 2
    assert capsys.readouterr().err == ("mcfl: error: dataset 'user_data_nope:load': cannot "
                                       "import 'user_data_nope' (No module named "
                                       "'user_data_nope')\n")
    # a factory that raises, or returns nothing: one line, exit code 2, no run folder
    sys.path.insert(0, str(tmp_path))
    try:
        for name, message in [
                ("user_data_cli:missing_file", "its factory failed with dataset_args {'n': 12}: "
                 "FileNotFoundError: /nonexistent-mcfl-dir/sensors.csv not found."),
                ("user_data_cli:nothing_back", "its factory returned NoneType; it must return "
                 "a FederatedDataset (mcfl.data.from_clients) or LabelledArrays (pooled rows)")]:
            out = tmp_path / name.replace(":", "-")
            argv[-1] = str(out)
            assert main([*argv, "--dataset", name]) == 2
            assert capsys.readouterr().err == f"mcfl: error: dataset {name!r}: {message}\n"
            assert not out.exists()
    finally:
        sys.path.remove(str(tmp_path))
