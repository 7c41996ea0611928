"""Fuzzing the command line: random settings, most of them invalid, given as flags or in JSON /
TOML config files, never end in a traceback. Each either passes every check (and reaches the
training, which is replaced here by a stub) or ends in one line on stderr and exit code 2.
A seeded generator makes every failure reproducible from its case number."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

import mcfl.apps.commands
from mcfl.apps.cli import main
from mcfl.apps.flags import flag_settings
from mcfl.config import all_keys

FLAG_VALUES = ("nan", "inf", "-inf", "-1", "0", "1", "0.5", "1e400", "99999999999999999999",
               "", "abc", "true", "false", "none", "[1]", "1.5", "-0", "2,3", "1e-400", "１",
               "tfds:", "dirichlet:-1", "rotated:0", "shards:x", "0x10", " 7", "4e0")
JSON_VALUES = (None, True, False, "false", "1", 1.5, -1, 0, 2 ** 70, float("nan"),
               float("inf"), [], {}, "x", "", 1e308, [1, "a"], "dirichlet:0", "natural")
KEYS = sorted(all_keys())


class ReachedTraining(Exception):
    """The stub training: the settings passed every check."""


@pytest.fixture
def stub_training(monkeypatch, tmp_path):
    def reached(*args, **kwargs):
        raise ReachedTraining

    monkeypatch.setattr(mcfl.apps.commands, "run", reached)
    monkeypatch.chdir(tmp_path)


def _outcome(argv, capsys) -> str:
    """'ok' (reached training) or 'error'; fails the test on anything else."""
    try:
        code = main(argv)
    except ReachedTraining:
        capsys.readouterr()
        return "ok"
    except SystemExit as e:  # argparse's own errors
        code = e.code
    except Exception as e:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{argv}: {type(e).__name__}: {e}")
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mcfl: error: "), (argv, err)
    assert "Traceback" not in err
    return "error"


def test_random_flags_never_raise(stub_training, capsys):
    rng = random.Random(2024)
    flags = [("--" + key.replace("_", "-"), hint) for key, hint, _ in flag_settings()]
    outcomes = []
    for _ in range(150):
        argv = ["run", "--rounds", "1"]
        for flag, hint in rng.sample(flags, rng.randint(1, 3)):
            if hint is bool:
                argv.append(flag if rng.random() < 0.5 else "--no-" + flag[2:])
            else:
                argv += [flag, rng.choice(FLAG_VALUES)]
        outcomes.append(_outcome(argv, capsys))
    assert outcomes.count("error") > 100  # the generator mostly makes bad input


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_random_config_files_never_raise(stub_training, capsys, tmp_path, suffix):
    rng = random.Random(7)
    outcomes = []
    for case in range(80):
        values = {}
        for key in rng.sample(KEYS, rng.randint(1, 3)):
            values[key] = rng.choice(JSON_VALUES)
        path = tmp_path / f"case{case}{suffix}"
        if suffix == ".json":
            path.write_text(json.dumps(values))
        else:
            path.write_text("".join(f"{k} = {_toml(v)}\n" for k, v in values.items()
                                    if _toml(v) is not None))
        outcomes.append(_outcome(["run", "--config", str(path)], capsys))
    assert outcomes.count("error") > 50


def _toml(value):
    """The TOML form of a JSON value (None: TOML has no null)."""
    if value is None or value == {}:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf"
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value)


@pytest.mark.parametrize("text", ["[1, 2]", "nan", "{", "\"x\"", "", "{\"lr\": NaN}"])
def test_malformed_json_config_files(stub_training, capsys, tmp_path, text):
    path = tmp_path / "c.json"
    path.write_text(text)
    assert _outcome(["run", "--config", str(path)], capsys) == "error"


def _leaf_document(users: dict) -> dict:
    return {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}


def _valid_leaf() -> dict:
    rows = lambda n, s: ([[s + k + j / 4 for j in range(3)] for k in range(n)],  # noqa: E731
                         [(s + k) % 3 for k in range(n)])
    return {"train": _leaf_document({"a": rows(4, 0), "b": rows(3, 10)}),
            "test": _leaf_document({"a": rows(2, 20), "b": rows(1, 30)})}


def _mutate(documents: dict, rng: random.Random):
    """One random defect in one of the two files: a value replaced, a key dropped, a list
    made longer or shorter, a row or label of the wrong kind; or the file's text damaged."""
    split = rng.choice(["train", "test"])
    document = documents[split]
    user = rng.choice(["a", "b"])
    kind = rng.randrange(9)
    if kind == 0:
        document[rng.choice(["users", "num_samples", "user_data"])] = rng.choice(JSON_VALUES)
    elif kind == 1:
        del document[rng.choice(["users", "num_samples", "user_data"])]
    elif kind == 2:
        document["users"].append(rng.choice(["a", "c", 3, None, ""]))
    elif kind == 3:
        i = rng.randrange(len(document["num_samples"]))
        document["num_samples"][i] = rng.choice([0, 1, 7, -1, True, 2.0, 2.5, "2", None])
    elif kind == 4:
        document["user_data"][user] = rng.choice(JSON_VALUES)
    elif kind == 5:
        entry = document["user_data"][user]
        entry[rng.choice(["x", "y"])] = rng.choice(JSON_VALUES)
    elif kind == 6:
        x = document["user_data"][user]["x"]
        x[rng.randrange(len(x))] = rng.choice(
            [[1.0, 2.0], [1.0, 2.0, 3.0, 4.0], [float("nan")] * 3, ["a"] * 3, [None] * 3,
             [[1.0]] * 3, 1.0, [], [True, False, True]])
    elif kind == 7:
        y = document["user_data"][user]["y"]
        y[rng.randrange(len(y))] = rng.choice([1.5, -1, "1", None, [1], 2 ** 70, float("inf")])
    else:
        document["user_data"]["z"] = {"x": [[0.0, 0.0, 0.0]], "y": [0]}
    return split


def _write_leaf_documents(root, documents: dict, damage: str = "") -> None:
    for split, document in documents.items():
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps(document).encode()
        if damage and split == damage.split(":")[0]:
            text = {"truncate": text[: len(text) // 2], "bytes": b"\xff\xfe" + text,
                    "empty": b""}[damage.split(":")[1]]
        (folder / "part.json").write_bytes(text)


def test_random_leaf_files_load_or_fail_in_one_line(tmp_path, capsys):
    """Damaged LEAF / FedProx JSON files: each is read as it is written or refused with one
    line naming the file (mcfl.data.leaf.load_leaf); a few go through `mcfl run` whole."""
    from mcfl.data.leaf import load_leaf
    from mcfl.errors import DataError

    rng = random.Random(22)
    outcomes = []
    for case in range(120):
        documents = _valid_leaf()
        damage = ""
        if case % 10 == 9:
            damage = rng.choice(["train", "test"]) + ":" + rng.choice(["truncate", "bytes",
                                                                     "empty"])
        else:
            for _ in range(rng.randint(1, 2)):
                try:
                    _mutate(documents, rng)
                except (KeyError, TypeError, IndexError, ValueError):
                    pass  # a second defect where the first left nothing to damage
        root = tmp_path / f"case{case}"
        _write_leaf_documents(root, documents, damage)
        try:
            dataset = load_leaf(root)
        except DataError as e:
            assert "\n" not in str(e) and str(e), (case, e)
            outcomes.append("error")
            continue
        except Exception as e:  # noqa: BLE001 - the point of the test
            pytest.fail(f"case {case}: {type(e).__name__}: {e}")
        x = np.concatenate([np.asarray(dataset.arrays.x_train), np.asarray(dataset.arrays.x_test)])
        assert np.isfinite(x).all() and x.shape[1:] == (3,), case
        outcomes.append("ok")
    assert outcomes.count("error") > 80, outcomes.count("error")
    # Through the command line: one line on stderr, exit 2, no folder made.
    for case in (0, 1, 2, 9):
        root = tmp_path / f"case{case}"
        out = tmp_path / f"out{case}"
        code = main(["run", "--dataset", "leaf", "--data-dir", str(root), "--rounds", "1",
                     "--no-cache", "--out", str(out)])
        err = capsys.readouterr().err
        if code == 2:
            assert err.count("\n") == 1 and err.startswith("mcfl: error: "), err
            assert not out.exists()
        else:
            assert code == 0, err


@pytest.mark.parametrize("argv, message", [
    (["run", "--hidden", "200,,200"], "invalid list of integers value: '200,,200'"),
    (["run", "--hidden", "0"], "invalid list of integers value: '0'"),
    (["sweep", "--grid", "lr=0.1,,0.2"], "--grid lr '0.1,,0.2' has an empty item"),
    (["sweep", "--grid", "lr=0.1,0.2,"], "--grid lr '0.1,0.2,' has an empty item"),
    (["sweep", "--grid", "lr=0.1,0.1"], "--grid lr '0.1,0.1' gives '0.1' twice"),
    (["sweep", "--grid", "hidden=20;;30"], "--grid hidden '20;;30' has an empty item; give "
     "values separated by ';', e.g. hidden=200,200;100"),
    (["select-k", "--k", "2,,3"], "--k '2,,3' has an empty item"),
    (["select-k", "--k", "2,3,2"], "--k '2,3,2' gives '2' twice"),
    (["select-k", "--k", "2.5"], "--k must be comma-separated integers >= 1, got '2.5'"),
    (["reproduce", "flexcfl-table3-synthetic", "--cells", "FedAvg,"],
     "--cells 'FedAvg,' has an empty item"),
    (["bench", "--clients", "100,,200"], "the client counts '100,,200' has an empty item"),
    (["bench", "--algorithms", "fedavg,fedavg"], "gives 'fedavg' twice"),
    (["run", "--dataset", "digits", "--clients", "10", "--samples-per-client", "1", "--no-cache"],
     "the dataset 'digits/iid' has no test rows for its 10 client(s); runs are scored on test "
     "rows: give a larger --test-fraction or --samples-per-client, or fewer --clients"),
])
def test_list_values_are_read_strictly(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
