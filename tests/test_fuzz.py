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


LEAF_KEYS = ("users", "num_samples", "user_data")
X_ITEMS = ("1.0", None, True, False, float("nan"), float("inf"), 1e39, 10 ** 400, 2 ** 70, [1.0],
           {}, "", -0.0, 3, -2.5)
Y_ITEMS = (1.5, -1, "1", None, [1], 2 ** 70, float("inf"), True, False, 1.0, 2, 65535, 65536)
X_ROWS = ([1.0, 2.0], [1.0, 2.0, 3.0, 4.0], [float("nan")] * 3, ["a"] * 3, [None] * 3,
          [[1.0]] * 3, 1.0, [], [True, False, True], "img.png", [1, 2, 3])
TEXT_DAMAGE = ("truncate", "bytes", "utf16", "empty", "bom", "repeated-key", "deep", "nan-count")


def _mutate(documents: dict, rng: random.Random) -> None:
    """One random defect (or a change a valid file may have) in one of the two files."""
    document = documents[rng.choice(["train", "test"])]
    user = rng.choice(["a", "b"])
    kind = rng.randrange(15)
    if kind == 0:
        document[rng.choice(LEAF_KEYS)] = rng.choice(JSON_VALUES)
    elif kind == 1:
        del document[rng.choice(LEAF_KEYS)]
    elif kind == 2:
        document["users"].append(rng.choice(["a", "c", 3, None, ""]))
    elif kind == 3:
        i = rng.randrange(len(document["num_samples"]))
        document["num_samples"][i] = rng.choice([0, 1, 7, -1, True, 2.0, 2.5, "2", None])
    elif kind == 4:
        document["user_data"][user] = rng.choice(JSON_VALUES)
    elif kind == 5:
        document["user_data"][user][rng.choice(["x", "y"])] = rng.choice(JSON_VALUES)
    elif kind == 6:
        x = document["user_data"][user]["x"]
        x[rng.randrange(len(x))] = rng.choice(X_ROWS)
    elif kind == 7:
        row = rng.choice(document["user_data"][user]["x"])
        row[rng.randrange(len(row))] = rng.choice(X_ITEMS)
    elif kind == 8:
        y = document["user_data"][user]["y"]
        y[rng.randrange(len(y))] = rng.choice(Y_ITEMS)
    elif kind == 9:
        document["user_data"]["z"] = {"x": [[0.0, 0.0, 0.0]], "y": [0]}
    elif kind == 10:  # a file listing nobody
        document.update(users=[], num_samples=[], user_data={})
    elif kind in (11, 12):  # a user without rows in this file, or not in it at all
        i = document["users"].index(user)
        if kind == 11:
            document["num_samples"][i] = 0
            document["user_data"][user] = {"x": [], "y": []}
        else:
            del document["users"][i], document["num_samples"][i], document["user_data"][user]
    elif kind == 13:  # a user renamed
        i = document["users"].index(user)
        name = rng.choice(["", 3, None, "\ud800", "b", "é"])
        document["users"][i] = name
        if isinstance(name, str):
            document["user_data"][name] = document["user_data"].pop(user)
    else:  # every row of a user empty
        entry = document["user_data"][user]
        entry["x"] = [[] for _ in entry["x"]]


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _in_float32(value) -> bool:
    try:
        return math.isfinite(float(value)) and abs(float(value)) <= np.finfo(np.float32).max
    except OverflowError:
        return False


def _strict_reading(documents: dict):
    """What the LEAF format (mcfl.data.leaf's docstring) makes of the two files, written out
    independently of the loader: each split's {user: (x, y)} with train users in order, or
    None where any rule is broken."""
    width, out = set(), {}
    for split in ("train", "test"):
        doc = documents[split]
        if not isinstance(doc, dict) or any(key not in doc for key in LEAF_KEYS):
            return None
        users, counts, data = (doc[key] for key in LEAF_KEYS)
        if not (isinstance(users, list) and isinstance(counts, list) and isinstance(data, dict)
                and len(users) == len(counts) and len(set(map(repr, users))) == len(users)):
            return None
        if any(not isinstance(u, str) or not u or any("\ud800" <= c <= "\udfff" for c in u)
               for u in users) or set(data) - set(users):
            return None
        out[split] = {}
        for user, count in zip(users, counts):
            entry = data.get(user)
            if not _is_number(count) or not isinstance(count, int) or count < 0 or not (
                    isinstance(entry, dict) and isinstance(entry.get("x"), list)
                    and isinstance(entry.get("y"), list)
                    and len(entry["x"]) == len(entry["y"]) == count):
                return None
            x, y = entry["x"], entry["y"]
            if not all(_is_number(v) and 0 <= v <= 65535 and float(v).is_integer() for v in y):
                return None
            if not all(isinstance(r, list) and r and all(_is_number(v) and _in_float32(v)
                                                         for v in r) for r in x):
                return None
            width |= {len(r) for r in x}
            if len(width) > 1:
                return None
            if count:
                out[split][user] = (np.asarray(x, np.float32), np.asarray(y, np.int64))
    train_users = documents["train"]["users"]
    if (not train_users or set(out["train"]) != set(train_users)
            or set(documents["test"]["users"]) - set(train_users)):
        return None
    return out


def _write_leaf_documents(root, documents: dict, damage: str = "") -> None:
    for split, document in documents.items():
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps(document)
        raw = text.encode()
        if damage and split == damage.split(":")[0]:
            raw = {"truncate": raw[: len(raw) // 2], "bytes": b"\xff\xfe" + raw,
                   "utf16": text.encode("utf-16"), "empty": b"", "bom": b"\xef\xbb\xbf" + raw,
                   "repeated-key": raw.replace(b'"users": ', b'"users": [], "users": ', 1),
                   "deep": b"[" * 100_000 + b"]" * 100_000,
                   "nan-count": raw.replace(b'"num_samples": [', b'"num_samples": [NaN, ', 1),
                   }[damage.split(":")[1]]
        (folder / "part.json").write_bytes(raw)


def _client_rows(dataset, split: str) -> dict:
    """{client id: (x, y)} of a loaded split."""
    arrays = dataset.arrays
    offsets, counts = (np.asarray(getattr(arrays, f"{split}_{k}")) for k in ("offsets", "counts"))
    x, y = np.asarray(getattr(arrays, f"x_{split}")), np.asarray(getattr(arrays, f"y_{split}"))
    return {user: (x[o:o + n], y[o:o + n])
            for user, o, n in zip(dataset.client_ids, offsets, counts) if n}


def test_random_leaf_files_load_or_fail_in_one_line(tmp_path, capsys):
    """Damaged LEAF / FedProx JSON files (fields dropped or retyped, wrong lengths, NaN,
    booleans, strings, empty lists, truncated or non-UTF-8 text): each loads exactly as the
    format's rules read it (`_strict_reading`: nothing is misread, nothing valid refused) or
    is refused with one line (mcfl.data.leaf.load_leaf); a few go through `mcfl run` whole."""
    from mcfl.data.leaf import load_leaf
    from mcfl.errors import DataError

    rng = random.Random(22)
    outcomes = []
    for case in range(400):
        documents = _valid_leaf()
        damage = ""
        if case % 8 == 7:
            damage = rng.choice(["train", "test"]) + ":" + rng.choice(TEXT_DAMAGE)
        else:
            for _ in range(rng.randint(1, 2)):
                try:
                    _mutate(documents, rng)
                except (KeyError, TypeError, IndexError, ValueError, AttributeError):
                    pass  # a second defect where the first left nothing to damage
        root = tmp_path / f"case{case}"
        _write_leaf_documents(root, documents, damage)
        expected = _strict_reading(documents) if damage.split(":")[-1] in ("", "bom") else None
        try:
            dataset = load_leaf(root)
        except DataError as e:
            assert "\n" not in str(e) and str(e), (case, e)
            assert expected is None, f"case {case}: valid files refused: {e}"
            outcomes.append("error")
            continue
        except Exception as e:  # noqa: BLE001 - the point of the test
            pytest.fail(f"case {case}: {type(e).__name__}: {e}")
        assert expected is not None, f"case {case}: invalid files read: {documents}"
        assert list(dataset.client_ids) == documents["train"]["users"], case
        for split in ("train", "test"):
            got = _client_rows(dataset, split)
            assert got.keys() == expected[split].keys(), (case, split)
            for user, (x, y) in expected[split].items():
                np.testing.assert_array_equal(got[user][0], x, err_msg=f"case {case}")
                np.testing.assert_array_equal(got[user][1], y, err_msg=f"case {case}")
        outcomes.append("ok" if dataset.test_counts().sum() else "ok, no test rows")
    assert 250 < outcomes.count("error") < 390, outcomes.count("error")
    # Through the command line: a valid case trains; invalid ones (and valid files without
    # test rows, which nothing could score) are one line on stderr, exit 2, no output folder.
    first_ok = outcomes.index("ok")
    failing = [i for i, o in enumerate(outcomes) if o == "error"][:2]
    failing.append(outcomes.index("ok, no test rows"))
    for case in (first_ok, *failing):
        out = tmp_path / f"out{case}"
        code = main(["run", "--dataset", "leaf", "--data-dir", str(tmp_path / f"case{case}"),
                     "--rounds", "1", "--no-cache", "--out", str(out)])
        err = capsys.readouterr().err
        if case == first_ok:
            assert code == 0 and (out / "summary.json").is_file(), err
        else:
            assert code == 2 and err.count("\n") == 1 and err.startswith("mcfl: error: "), err
            assert "Traceback" not in err and not out.exists()

