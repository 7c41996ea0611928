"""Studies survive a stop: a sweep or a reproduced table killed (SIGKILL) midway says it is
incomplete, and its resume equals the uninterrupted study; every folder says what it holds
and no command writes into (or --overwrites) another command's folder; a study's
--overwrite keeps the old one until the new one has started."""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from fault_driver import mcfl_killed_at, python_killed_at

import mcfl
from mcfl import reproduce
from mcfl.apps.cli import main
from mcfl.config import from_dict
from mcfl.errors import McflError
from mcfl.files import kinds
from mcfl.files.faults import FaultPlan

# 4 members (2 grid points x 2 seeds) in chunks of 2, 6 rounds, a checkpoint every 2 rounds:
# chunk 1 passes the fault point "checkpoint" 3 times, chunk 2 again from the 4th.
SWEEP = {"algorithm": "fedavg", "dataset": "synthetic", "clients": 8, "rounds": 6,
         "eval_every": 2, "lr": 0.05}
GRID = {"lr": [0.05, 0.1]}
SWEEP_FLAGS = ["--algorithm", "fedavg", "--dataset", "synthetic", "--clients", "8",
               "--rounds", "6", "--eval-every", "2", "--seeds", "0-1", "--grid",
               "lr=0.05,0.1", "--members-per-chunk", "2", "--checkpoint-every", "2",
               "--no-cache"]


def _sweep(out, seeds=2, **kwargs):
    return mcfl.sweep(from_dict(SWEEP), seeds=seeds, grid=GRID, out_dir=out,
                      members_per_chunk=2, checkpoint_every=2, **kwargs)


@pytest.fixture(scope="module")
def whole_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("study") / "whole"
    _sweep(out)
    return out


def _table(path, drop=("seconds", "wall_seconds")):
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(f)]


def _files(folder):
    """Every file under `folder` with its bytes' digest."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _killed(command, cwd=None):
    """Run `command` (a `fault_driver` command line, its fault installed) and check the fault
    killed it."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]


def test_a_killed_sweep_says_what_is_missing_and_resumes_to_the_whole_sweep(whole_sweep,
                                                                           tmp_path):
    out = tmp_path / "killed"
    # killed as chunk 2 writes its round-4 checkpoint: chunk 1 is done, chunk 2 at round 2
    _killed(mcfl_killed_at(FaultPlan("checkpoint", 5), "sweep", *SWEEP_FLAGS, "--out", str(out)))
    spec = json.loads((out / "sweep.json").read_text())
    assert spec["kind"] == "sweep" and spec["status"] == "running"
    assert spec["pending_members"] == [2, 3]
    members = _table(out / "members.csv")
    assert [m["status"] for m in members] == ["completed", "completed", "pending", "pending"]
    assert [(s["members"], s["completed"], s["pending"]) for s in _table(out / "summary.csv")
            ] == [("2", "2", "0"), ("2", "0", "2")]
    assert kinds.folder_kind(out) == "sweep"
    assert main(["sweep", "--resume", str(out)]) == 0
    for name in ("members.csv", "rounds.csv", "summary.csv"):
        assert _table(out / name) == _table(whole_sweep / name), name
    spec = json.loads((out / "sweep.json").read_text())
    assert spec["status"] == "completed" and spec["pending_members"] == []
    assert not (out / "checkpoints").exists() and (out / "curves.png").is_file()
    # a completed sweep: nothing to resume (the library reads it back as it is)
    assert main(["sweep", "--resume", str(out)]) == 2
    again = mcfl.sweep(resume=out)
    assert again.members == mcfl.sweep(resume=whole_sweep).members


def test_sigterm_stops_a_sweep_at_a_checkpoint_and_names_its_folder(whole_sweep, tmp_path):
    out = tmp_path / "stopped"
    process = subprocess.Popen([sys.executable, "-m", "mcfl", "sweep", *SWEEP_FLAGS,
                                "--rounds", "60", "--checkpoint-every", "1000", "--out",
                                str(out)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (out / "sweep.json").is_file() or not json.loads(
            (out / "sweep.json").read_text()).get("groups_run"):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.2)
    time.sleep(2)  # into the rounds
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-2000:]
    assert f"mcfl sweep --resume {out}" in stderr and "Traceback" not in stderr
    assert json.loads((out / "sweep.json").read_text())["status"] == "interrupted"
    assert (out / "checkpoints").is_dir()  # the stop's checkpoint: the chunk goes on from it


def test_a_run_does_not_write_over_a_sweep_nor_a_sweep_over_a_run(whole_sweep, tmp_path,
                                                                  capsys):
    before = _files(whole_sweep)
    assert main(["run", "--clients", "4", "--rounds", "1", "--out", str(whole_sweep),
                 "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a sweep (sweep.json), not a run" in err
    assert "--overwrite" in err and "choose another --out" in err
    assert main(["run", "--resume", str(whole_sweep)]) == 2
    err = capsys.readouterr().err
    assert "not a run" in err and "--overwrite" not in err
    assert _files(whole_sweep) == before
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "run.json").write_text("{}")
    with pytest.raises(McflError, match="holds a run .*not a sweep.*mcfl run --resume"):
        _sweep(run_dir, overwrite=True)
    with pytest.raises(McflError, match="holds a run .*not a reproduced table"):
        reproduce.run_table("flexcfl-table3-synthetic", run_dir, quick=True, overwrite=True)
    for kind, marker in kinds.MARKERS.items():  # every kind is told apart by its marker
        folder = tmp_path / kind
        folder.mkdir()
        (folder / marker).write_text("{}")
        assert kinds.folder_kind(folder) == kind
        other = "run" if kind != "run" else "sweep"
        with pytest.raises(McflError, match=f"not {kinds.NAMES[other]}"):
            kinds.check_kind(folder, other)


def test_overwrite_keeps_the_old_sweep_until_the_new_one_starts(whole_sweep, tmp_path):
    out = tmp_path / "replaced"
    _sweep(out)
    before = _files(out)

    def stop(done, total):  # the new sweep stops before its first round's checkpoint
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _sweep(out, overwrite=True, progress=stop)
    assert _files(out) == before
    assert not any(p.name.endswith(".mcfl-new") for p in tmp_path.iterdir())
    seen = []

    def stop_later(done, total):  # past the first checkpoint: the new sweep has replaced it
        if done > 0:  # the second report of rounds done (a round's, or a scanned chunk's)
            seen.append(done)
        if len(seen) >= 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _sweep(out, overwrite=True, progress=stop_later, seeds=[5, 6])
    spec = json.loads((out / "sweep.json").read_text())
    assert spec["seeds"] == [5, 6] and spec["status"] == "interrupted"


TABLE = dict(quick=True, seeds=2, cells=["FedAvg", "FedProx (mu 1)"],
             overrides={"clients": 40, "rounds": 2, "local_epochs": 1, "eval_every": 1})


def test_a_killed_table_says_it_is_incomplete_and_resumes_to_the_whole_table(tmp_path):
    whole = tmp_path / "whole"
    reproduce.run_table("flexcfl-table3-synthetic", whole, **TABLE)
    out = tmp_path / "killed"
    code = (f"from mcfl import reproduce; reproduce.run_table('flexcfl-table3-synthetic', "
            f"{str(out)!r}, **{TABLE!r})")
    _killed(python_killed_at(FaultPlan("cell", 1), code))  # the first cell done, the second not
    text = (out / "table.md").read_text()
    assert text.startswith("**INCOMPLETE (running): 1 of 2 cells; missing: FedProx (mu 1).**")
    assert f"mcfl reproduce --resume {out}" in text
    assert [(r["cell"], r["status"]) for r in _table(out / "table.csv")] == [
        ("FedAvg", "completed"), ("FedProx (mu 1)", "pending")]
    assert json.loads((out / "reproduce.json").read_text())["missing_cells"] == [
        "FedProx (mu 1)"]
    first = _files(out / "cells" / "fedavg")
    assert main(["reproduce", "--resume", str(out)]) == 0
    assert _files(out / "cells" / "fedavg") == first  # a finished cell is not recomputed
    assert _table(out / "table.csv") == _table(whole / "table.csv")
    assert not (out / "table.md").read_text().startswith("**INCOMPLETE")
    assert json.loads((out / "reproduce.json").read_text())["status"] == "completed"
    with pytest.raises(McflError, match="is complete; there is nothing to resume"):
        reproduce.run_table(resume=out)
    # --overwrite: the old table stays until the new one's first cell is done
    before = _files(whole)

    def stop(label, i, count):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        reproduce.run_table("flexcfl-table3-synthetic", whole, overwrite=True, progress=stop,
                            **TABLE)
    assert _files(whole) == before


def test_export_overwrite_replaces_only_an_export(tmp_path):
    from mcfl import load_dataset
    from mcfl.data.export import export_dataset

    dataset = load_dataset(from_dict({"dataset": "synthetic", "clients": 3}))
    sweep_like = tmp_path / "sweep"
    sweep_like.mkdir()
    (sweep_like / "sweep.json").write_text("{}")
    (sweep_like / "members.csv").write_text("member\n")
    before = _files(sweep_like)
    with pytest.raises(McflError, match="holds a sweep .*mcfl data export neither writes"):
        export_dataset(dataset, sweep_like, "npz", overwrite=True)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "mine.txt").write_text("keep me")
    with pytest.raises(McflError, match="not an mcfl export"):
        export_dataset(dataset, notes, "npz", overwrite=True)
    assert _files(sweep_like) == before and (notes / "mine.txt").read_text() == "keep me"
    export = export_dataset(dataset, tmp_path / "export", "npz")
    export_dataset(dataset, export, "leaf", overwrite=True)  # an export replaces an export
    assert kinds.folder_kind(export) == "export" and (export / "train").is_dir()


def test_compare_reads_an_unfinished_run_and_names_other_kinds(tmp_path, capsys):
    run_dir = tmp_path / "run"
    mcfl.run(from_dict({"clients": 4, "rounds": 2}), out_dir=run_dir)
    (run_dir / "summary.json").unlink()  # as a kill before the end leaves it
    assert main(["compare", "--runs", str(run_dir), "--out", str(tmp_path / "c.png")]) == 0
    assert "run (fedavg, unfinished at round 2)" in capsys.readouterr().out
    table = tmp_path / "table"
    table.mkdir()
    (table / "reproduce.json").write_text("{}")
    assert main(["compare", "--runs", str(table), "--out", str(tmp_path / "c.png")]) == 2
    assert f"compare its cells' sweeps: {table}/cells/*" in capsys.readouterr().err


def test_a_sweep_stopped_by_a_full_disk_is_one_line_and_resumes(whole_sweep, tmp_path,
                                                                  capsys, monkeypatch):
    out = tmp_path / "full"
    real_replace, calls = os.replace, []

    def replace(src, dst, *args, **kwargs):  # the 3rd members.csv: after chunk 1's
        if str(dst).endswith("members.csv"):
            calls.append(dst)
            if len(calls) == 3:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_replace(src, dst, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", replace)
        assert main(["sweep", *SWEEP_FLAGS, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"cannot write '{out / 'members.csv'}': No space left on device" in err
    assert json.loads((out / "sweep.json").read_text())["status"] == "error"
    assert not list(out.glob(".*.mcfl-tmp"))
    assert main(["sweep", "--resume", str(out)]) == 0
    for name in ("members.csv", "rounds.csv", "summary.csv"):
        assert _table(out / name) == _table(whole_sweep / name), name
