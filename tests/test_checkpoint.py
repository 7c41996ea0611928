"""Checkpoints and resume: a run stopped by a signal and resumed from its folder writes what
the uninterrupted run writes (rounds.csv, summary.json, clients.csv, assignments), apart from
timings; in-process (SIGINT raised at a round) and as a subprocess killed with SIGTERM."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import mcfl
from mcfl.apps.cli import main

TIMINGS = {"wall_seconds", "init_seconds", "compile_seconds", "seconds_per_round",
           "first_round_seconds"}


@pytest.fixture(autouse=True, scope="module")
def compile_once():
    """Each case runs its config three times (whole, stopped, resumed) and the subprocesses
    start afresh: JAX's persistent cache (the tests' temporary one) compiles each program once."""
    from mcfl.runtime import compile_cache

    compile_cache.enable()


def _rounds(folder):
    with open(folder / "rounds.csv") as f:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(f)]


def _summary(folder):
    summary = json.loads((folder / "summary.json").read_text())
    return {k: v for k, v in summary.items() if k not in TIMINGS}


def assert_same_run(a, b):
    assert _rounds(a) == _rounds(b)
    assert _summary(a) == _summary(b)
    assert (a / "clients.csv").read_text() == (b / "clients.csv").read_text()
    for name in ("assignments.npz", "clients_pca.npz"):
        if (a / name).exists() or (b / name).exists():
            with np.load(a / name) as x, np.load(b / name) as y:
                assert sorted(x.files) == sorted(y.files)
                for key in x.files:
                    np.testing.assert_array_equal(x[key], y[key])


class SignalAt(mcfl.RunObserver):
    """Sends this process SIGINT when round `at` is reported (as Ctrl-C would)."""

    def __init__(self, at):
        self.at = at

    def round(self, row):
        if row["round"] == self.at:
            signal.raise_signal(signal.SIGINT)


def test_sigint_stops_at_a_chunk_end_and_resume_equals_an_uninterrupted_run(tmp_path):
    # A clustered algorithm under a distribution shift, rounds scanned between evaluations:
    # the signal at round 3 is honoured when the chunk (rounds 3-4) ends.
    config = mcfl.RunConfig(algorithm="flexcfl", clients=12, rounds=6, clusters=2,
                            pretrain_scale=2, shift="swap_all", shift_prob=0.5,
                            scan_rounds="on", eval_every=2, embed_clients=4,
                            clients_per_round=6, seed=3)
    mcfl.run(config, out_dir=tmp_path / "whole")
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs in the background
    with pytest.raises(KeyboardInterrupt):
        mcfl.run(config, out_dir=tmp_path / "cut", observers=(SignalAt(3),),
                 checkpoint_every=100)  # only the stop's checkpoint
    cut = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert cut["status"] == "interrupted" and cut["rounds_completed"] == 4
    assert os.listdir(tmp_path / "cut" / "checkpoints") == ["4"]
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored

    rows = []
    result = mcfl.run(resume=tmp_path / "cut", progress=lambda r, row: rows.append(r))
    assert rows == list(range(1, config.rounds + 1))  # the kept rounds are replayed first
    assert result.config == config
    assert_same_run(tmp_path / "cut", tmp_path / "whole")


def test_checkpoints_every_n_rounds_keep_the_latest(tmp_path, monkeypatch):
    from mcfl.files import checkpoint

    saved = []
    original = checkpoint.Checkpoints.save
    monkeypatch.setattr(checkpoint.Checkpoints, "save",
                        lambda self, r, *a: (saved.append(r), original(self, r, *a)))
    config = mcfl.RunConfig(clients=6, rounds=7, clients_per_round=3)
    mcfl.run(config, out_dir=tmp_path, checkpoint_every=3)
    assert saved == [3, 6, 7]  # every 3 rounds and at the end
    assert os.listdir(tmp_path / "checkpoints") == ["7"]
    with pytest.raises(mcfl.McflError, match="already finished all 7 rounds"):
        mcfl.run(resume=tmp_path)
    # (a completed run is not offered --resume)
    with pytest.raises(mcfl.McflError, match=r"pass --overwrite to replace it, or choose"):
        mcfl.run(config, out_dir=tmp_path)
    mcfl.run(config.replace(rounds=1), out_dir=tmp_path, overwrite=True)
    assert os.listdir(tmp_path / "checkpoints") == ["1"]  # the old run's checkpoint went


def test_resume_refuses_another_config_and_bad_requests(tmp_path, capsys):
    config = mcfl.RunConfig(clients=6, rounds=3, clients_per_round=3)
    with pytest.raises(KeyboardInterrupt):
        mcfl.run(config, out_dir=tmp_path / "cut", observers=(SignalAt(1),))
    with pytest.raises(mcfl.ConfigError, match=r"lr=0.5 \(checkpoint: 0.01\)"):
        mcfl.run(config.replace(lr=0.5), resume=tmp_path / "cut")
    with pytest.raises(mcfl.ConfigError, match="writes to its own folder"):
        mcfl.run(resume=tmp_path / "cut", out_dir=tmp_path / "elsewhere")
    with pytest.raises(mcfl.McflError,
                       match="--checkpoint-every must be a whole number of rounds >= 1"):
        mcfl.run(config, checkpoint_every=0)
    cut = str(tmp_path / "cut")
    for argv, message in [
        (["--resume", cut, "--lr", "0.1"], "drop --lr"),
        (["--resume", cut, "--overwrite"], "contradict"),
        (["--resume", str(tmp_path / "none")], "no such folder (it takes a run's folder)"),
        (["--resume", str(tmp_path)], "holds no run to resume (no run.json, checkpoint or "
         "rounds)"),
        (["--resume", cut, "--out", str(tmp_path / "x")], "drop --out"),
        (["--clients", "4", "--checkpoint-every", "0", "--out", str(tmp_path / "y")],
         "--checkpoint-every must be a whole number of rounds >= 1, got 0"),
    ]:
        assert main(["run", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_sigterm_kills_a_cli_run_and_resume_finishes_it(tmp_path):
    """SIGTERM to the real command line, in a process of its own; then --resume."""
    # (rounds take about 20 ms here: the tests run XLA with its optimisations off)
    flags = ["--clients", "10", "--rounds", "100", "--eval-every", "20", "--seed", "4"]
    out = tmp_path / "run"
    command = [sys.executable, "-m", "mcfl", "run", *flags, "--out", str(out)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        rounds = out / "rounds.csv"
        if rounds.exists() and rounds.read_text().count("\n") >= 4:  # three rounds written
            child.send_signal(signal.SIGTERM)
            break
        time.sleep(0.01)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 130, err
    assert f"continue it with: mcfl run --resume {out}" in err
    stopped = json.loads((out / "summary.json").read_text())
    assert stopped["status"] == "interrupted" and 3 <= stopped["rounds_completed"] < 100

    # (the resume and the whole run in this process: the signal is what needs the process)
    assert main(["run", "--resume", str(out)]) == 0
    assert main(["run", *flags, "--out", str(tmp_path / "whole")]) == 0
    assert_same_run(out, tmp_path / "whole")
