"""The dataset cache, `mcfl data describe / plot`, and true clusters in clients.csv."""

from __future__ import annotations

import csv
import json

import numpy as np
from test_loaders import write_mnist_folder

import mcfl
from mcfl import load_dataset
from mcfl.apps.cli import main
from mcfl.data import cache


def test_cache_round_trip_and_invalidation(tmp_path, monkeypatch):
    write_mnist_folder(tmp_path / "mnist", n_train=40, n_test=10)
    config = mcfl.RunConfig(dataset="mnist", data_dir=str(tmp_path / "mnist"), clients=5,
                            partition="rotated:2")
    cached = load_dataset(config, cache_dir=tmp_path / "cache")
    files = list((tmp_path / "cache").glob("mnist-*.npz"))
    assert len(files) == 1

    def fail(_):
        raise AssertionError("rebuilt instead of read from the cache")

    monkeypatch.setattr("mcfl.data.build_dataset", fail)
    again = load_dataset(config, cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(again.arrays.x_train, cached.arrays.x_train)
    np.testing.assert_array_equal(again.true_cluster, cached.true_cluster)
    assert again.client_ids == cached.client_ids and again.name == cached.name
    monkeypatch.undo()
    # A different data config, or changed source files, is a different entry.
    load_dataset(config.replace(clients=4), cache_dir=tmp_path / "cache")
    write_mnist_folder(tmp_path / "mnist", n_train=41, n_test=10)
    load_dataset(config, cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("mnist-*.npz"))) == 3


def test_damaged_cache_entry_is_rebuilt(tmp_path):
    config = mcfl.RunConfig(dataset="digits", clients=10)
    load_dataset(config, cache_dir=tmp_path)
    (entry,) = tmp_path.glob("*.npz")
    entry.write_bytes(b"not a zip file")
    assert cache.load(entry) is None
    rebuilt = load_dataset(config, cache_dir=tmp_path)
    np.testing.assert_array_equal(rebuilt.arrays.y_train, load_dataset(config).arrays.y_train)


def test_data_describe_reports_recipe_statistics(capsys):
    argv = ["data", "describe", "--dataset", "digits", "--partition", "shards:2", "--clients",
            "30", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["clients"] == 30 and d["train_samples"] + d["test_samples"] == 1797
    assert d["classes_per_client"]["min"] == d["classes_per_client"]["max"] == 2
    assert main(["data", "describe", "--dataset", "digits", "--partition", "permuted:3",
                 "--clients", "30"]) == 0
    out = capsys.readouterr().out
    assert "true clusters              [10, 10, 10]" in out and "classes per client" in out


def test_data_plot_writes_png(tmp_path):
    out = tmp_path / "labels.png"
    assert main(["data", "plot", "--dataset", "digits", "--partition", "dirichlet:0.1",
                 "--clients", "20", "--out", str(out), "--no-cache"]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_data_errors_are_one_line(capsys, tmp_path):
    for argv, message in [
        (["--dataset", "mnist", "--data-dir", str(tmp_path / "nope")], "does not exist"),
        (["--dataset", "digits", "--partition", "shards:12"], "got 12"),
        (["--dataset", "digits", "--clients", "5000"], "5000 clients need at least"),
        (["--dataset", "digits", "--partition", "dirichlet:0"],
         "alpha must be a finite number in (0, 1e+06]"),
        (["--dataset", "tfds:imagenet"], "unknown tfds dataset 'imagenet'"),
    ]:
        assert main(["data", "describe", *argv, "--no-cache"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_clients_csv_has_true_cluster(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--dataset", "digits", "--partition", "rotated:2", "--clients", "10",
                 "--rounds", "1", "--model", "mclr", "--out", str(out), "--no-cache"]) == 0
    with open(out / "clients.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["true_cluster"]) for r in rows) == [0] * 5 + [1] * 5


def test_leaf_without_data_dir_is_a_clear_error(capsys):
    assert main(["data", "describe", "--dataset", "leaf", "--no-cache"]) == 2
    assert "dataset 'leaf' needs --data-dir (a folder with train/ and test/ JSON files)" in (
        capsys.readouterr().err)


def test_cache_key_changes_with_the_data_code(monkeypatch):
    settings = {"dataset": "digits", "clients": 10}
    before = cache.cache_key(settings)
    assert cache.cache_key(settings) == before
    monkeypatch.setattr(cache, "code_fingerprint", lambda: "a recipe was edited")
    assert cache.cache_key(settings) != before
