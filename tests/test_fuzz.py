"""Fuzzing the command line: random settings, most of them invalid, given as flags or in JSON /
TOML config files, never end in a traceback. Each either passes every check (and reaches the
training, which is replaced here by a stub) or ends in one line on stderr and exit code 2.
A seeded generator makes every failure reproducible from its case number."""

from __future__ import annotations

import json
import math
import random

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
