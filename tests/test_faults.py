"""Faults lose nothing: a run killed (SIGKILL) anywhere, or stopped by a full disk or a
read-only folder, leaves files that are whole, and `mcfl run --resume` finishes it with the
uninterrupted run's results; --overwrite replaces a run only once the new one has its first
checkpoint; a run that cannot fit in memory, or whose data are bad, is refused in one line
before any file is made."""

from __future__ import annotations

import collections
import csv
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from fault_driver import mcfl_killed_at
from test_checkpoint import SignalAt, assert_same_run

import mcfl
from mcfl.apps import user_environment
from mcfl.apps.cli import main
from mcfl.files import checkpoint, faults
from mcfl.files.faults import FaultPlan
from mcfl.files.run_folder import run_status
from mcfl.runtime import memory

# A clustered run (assignments, embedding) small enough that a process takes ~3 s, with a
# checkpoint every 2 rounds: many windows (rows, checkpoints, final files) to be killed in.
FLAGS = ["--algorithm", "ifca", "--clusters", "2", "--clients", "8", "--clients-per-round", "4",
         "--rounds", "12", "--eval-every", "3", "--checkpoint-every", "2", "--no-cache"]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted run (in this process; the subprocesses share its compiled programs
    through JAX's persistent cache under the tests' MCFL_CACHE_DIR)."""
    out = tmp_path_factory.mktemp("faults") / "whole"
    assert main(["run", *FLAGS, "--out", str(out)]) == 0
    return out


def _command(*args):
    return [sys.executable, "-m", "mcfl", "run", *args]


def _assert_whole_files(folder):
    """What a stop may leave: rounds.csv ends at a row's end with rounds 1, 2, ...; every
    JSON file parses; no temporary file is left where a later run would read."""
    rounds = folder / "rounds.csv"
    if rounds.exists():
        text = rounds.read_text()
        assert text.endswith("\n"), text[-200:]
        numbers = [int(row["round"]) for row in csv.DictReader(text.splitlines())]
        assert numbers == list(range(1, len(numbers) + 1))
    for name in ("summary.json", "run.json"):
        if (folder / name).exists():
            json.loads((folder / name).read_text())


def _run_to_the_end(out):
    """Resume (or start again, if the kill came before run.json) until the run completes: in
    this process (the kill was what needed one of its own; this process has the programs
    compiled, by `whole`)."""
    argv = (["--resume", str(out)] if (out / "run.json").exists()
            else [*FLAGS, "--out", str(out)])
    assert main(["run", *argv]) == 0


KILLS = 4  # (20, then 12, then 8, until the suite's budget needed the time; each kill is a
# process start; the points are drawn with a fixed seed, and tests/test_study_resume.py kills
# sweeps and tables too)


def test_kills_at_random_points_each_resume_to_the_uninterrupted_run(whole, tmp_path):
    """SIGKILL at `KILLS` points drawn with a fixed seed: after a row, before / inside a checkpoint
    write (killed 1-30 ms into it), between a file's new version and its rename, in the window
    between the last checkpoint and the final files, and at random times. Each stop is resumed
    (`--resume`, or started again when the kill came before the run wrote run.json); whenever
    the run completes, its files equal the uninterrupted run's, and the next kills go on with
    a new run."""
    rng = np.random.default_rng(22)
    out = tmp_path / "cut"
    landed: collections.Counter = collections.Counter()
    # The windows the issue names first (a checkpoint's first, while a fresh run still has
    # checkpoints ahead: after a kill in the final window, a resume writes none), then random
    # ones.
    schedule = [("checkpoint", 2, 5), ("replace", 1, 0), ("finished", 1, 0)]
    completed = 0
    while sum(landed.values()) - landed["inside a checkpoint write"] < KILLS:
        if schedule:
            name, count, delay = schedule.pop(0)
        else:
            name = str(rng.choice(["row", "checkpoint", "replace", "finished", "timer"]))
            count = int(rng.integers(1, {"row": 8, "checkpoint": 4, "replace": 5}.get(name, 2)))
            delay = int(rng.choice([0, rng.integers(1, 30)])) if name == "checkpoint" else 0
        args = (["--resume", str(out)] if (out / "run.json").exists()
                else [*FLAGS, "--out", str(out)])
        if name == "timer":
            child = subprocess.Popen(_command(*args), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
            time.sleep(float(rng.uniform(0.5, 3.0)))
            child.send_signal(signal.SIGKILL)
            stderr = child.communicate(timeout=60)[1]
            returncode = child.returncode
        else:
            done = subprocess.run(mcfl_killed_at(FaultPlan(name, count, delay), "run", *args),
                                  capture_output=True, text=True, timeout=300)
            returncode, stderr = done.returncode, done.stderr
        if returncode == -signal.SIGKILL:
            landed[name] += 1
            if list(out.glob("checkpoints/*.orbax-checkpoint-tmp*")):
                landed["inside a checkpoint write"] += 1  # (counted again, by its place)
            _assert_whole_files(out)
            if run_status(out) != "completed":  # (a kill after the summary: it is whole)
                continue
        else:
            assert returncode == 0, stderr[-2000:]  # the run ended before the point came
        assert_same_run(whole, out)
        completed += 1
        shutil.rmtree(out)
    _run_to_the_end(out)
    assert_same_run(whole, out)
    assert landed["finished"] >= 1 and landed["checkpoint"] >= 1 and landed["replace"] >= 1
    print(f"kills: {dict(landed)}; runs completed between kills: {completed}")


def test_a_fault_kills_at_the_nth_pass_of_its_point_only_while_installed(monkeypatch):
    """The hook itself, with the kill recorded instead: the `count`-th pass of the named point
    (other points do not count), once; after `delay_ms` from a timer; nothing once `kill_at`'s
    block ends or after `clear`, and nothing read from the environment."""
    kills = []
    monkeypatch.setattr(faults, "_kill", lambda: kills.append(time.perf_counter()))
    monkeypatch.setenv("MCFL_KILL_AT", "row:1")  # the old variable: no longer read
    faults.point("row")
    assert kills == []
    with faults.kill_at("row", 3) as plan:
        assert plan == FaultPlan("row", 3, 0.0)
        for name in ("row", "checkpoint", "row", "checkpoint"):
            faults.point(name)
        assert kills == []
        faults.point("row")
        faults.point("row")
        assert len(kills) == 1
    faults.point("row")
    assert len(kills) == 1
    faults.install(FaultPlan("checkpoint", 1, delay_ms=50))
    started = time.perf_counter()
    faults.point("checkpoint")
    assert len(kills) == 1  # not yet: 50 ms later
    deadline = time.monotonic() + 10
    while len(kills) == 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(kills) == 2 and kills[1] - started >= 0.045
    faults.clear()
    faults.point("checkpoint")
    assert len(kills) == 2
    with pytest.raises(ValueError, match="n-th pass"):
        faults.install(FaultPlan("row", 0))


def _write_fault(monkeypatch, site: str, code: int, nth: int):
    """Make the `nth` write of `site` fail with `code`: rounds.csv's appends (half a row is
    written first, as a full disk does), a file's rename into place (summary.json,
    clients.csv), or orbax's checkpoint save (wrapped the way orbax wraps it)."""
    calls = collections.Counter()
    if site == "rounds.csv":
        real_write = os.write

        def write(fd, data):
            if os.readlink(f"/proc/self/fd/{fd}").endswith("rounds.csv"):
                calls[site] += 1
                if calls[site] == nth:
                    real_write(fd, data[: len(data) // 2])
                    raise OSError(code, os.strerror(code))
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", write)
    elif site == "checkpoints":
        import orbax.checkpoint as ocp

        real_save = ocp.CheckpointManager.save

        def save(self, *args, **kwargs):
            calls[site] += 1
            if calls[site] == nth:
                try:
                    raise OSError(code, os.strerror(code))
                except OSError as cause:
                    raise RuntimeError("orbax: the save failed") from cause
            return real_save(self, *args, **kwargs)

        monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    else:
        real_replace = os.replace

        def replace(src, dst, *args, **kwargs):
            if str(dst).endswith(site):
                calls[site] += 1
                if calls[site] == nth:
                    raise OSError(code, os.strerror(code))
            return real_replace(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, "replace", replace)


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("site, code, nth", [
    ("rounds.csv", errno.ENOSPC, 5),
    ("checkpoints", errno.EROFS, 2),
    ("summary.json", errno.EACCES, 1),
    ("clients.csv", errno.ENOSPC, 1),
])
def test_a_failed_write_is_one_line_keeps_what_was_written_and_resumes(
        whole, tmp_path, capsys, monkeypatch, site, code, nth):
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        _write_fault(patch, site, code, nth)
        assert main(["run", *FLAGS, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"cannot write '{out / site}': {os.strerror(code)}" in err, err
    _assert_whole_files(out)
    assert not list(out.glob(".*.mcfl-tmp"))
    assert main(["run", "--resume", str(out)]) == 0
    assert_same_run(whole, out)


def test_full_disk_and_read_only_folder_for_real(whole, tmp_path):
    """The same on a real 1 MB tmpfs (a full disk: its checkpoint cannot be written) and a
    folder made read-only mid-run with root's override dropped; skipped where neither can be
    set up (not root, no setpriv)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (to mount a tmpfs) and setpriv (to drop root's override)")
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        filler = disk / "filler"
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        filler.write_bytes(b"\0" * (free - 100 * 1024))
        done = subprocess.run(_command(*FLAGS, "--out", str(disk / "run")), text=True,
                              capture_output=True, timeout=300)
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1 and "No space left on device" in done.stderr
        _assert_whole_files(disk / "run")
        filler.unlink()
        _run_to_the_end(disk / "run")
        assert_same_run(whole, disk / "run")
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)

    drop = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
            "--bounding-set=-dac_override,-dac_read_search"]
    out = tmp_path / "ro" / "run"
    flags = [*FLAGS[:FLAGS.index("--rounds")], "--rounds", "100",
             *FLAGS[FLAGS.index("--rounds") + 2:]]
    child = subprocess.Popen([*drop, *_command(*flags, "--out", str(out))], text=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while not (out / "checkpoints").is_dir() and child.poll() is None:
        time.sleep(0.05)
    subprocess.run(["chmod", "-R", "a-w", str(out)], check=True)
    err = child.communicate(timeout=300)[1]
    assert child.returncode == 2
    assert err.count("\n") == 1 and "Permission denied" in err, err
    subprocess.run(["chmod", "-R", "u+w", str(out)], check=True)
    _assert_whole_files(out)
    done = subprocess.run([*drop, *_command("--resume", str(out))], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_after_a_failed_save_late_closed_loop_reports_are_dropped(monkeypatch):
    """tensorstore's threads report writes a failed save cut short as unraisable "Event loop is
    closed" errors, at any later moment: after the failure those are dropped (they broke the
    one-line error in CI, half a traceback printed around it); any other report still shows."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: seen.append(report.exc_value))
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)

    class RaisesWhenCollected:
        def __init__(self, error):
            self.error = error

        def __del__(self):
            raise self.error

    with pytest.raises(OSError), checkpoint._quiet_orbax():
        raise OSError(errno.ENOSPC, "No space left on device")
    RaisesWhenCollected(RuntimeError("Event loop is closed"))
    RaisesWhenCollected(ValueError("another fault"))
    assert [str(e) for e in seen] == ["another fault"]


def test_overwrite_keeps_the_old_run_until_the_new_one_has_a_checkpoint(whole, tmp_path,
                                                                         capsys):
    out = tmp_path / "run"
    shutil.copytree(whole, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def unchanged():
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
        assert not (tmp_path / ".run.mcfl-new").exists()

    # Bad data: refused before anything is replaced.
    assert main(["run", "--dataset", "leaf", "--data-dir", str(tmp_path / "none"),
                 "--out", str(out), "--overwrite"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    unchanged()
    # Divergence in the first round: the new run never had a checkpoint.
    assert main(["run", *FLAGS, "--lr", "1e30", "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "training diverged" in err and f"the run it was to replace in '{out}' is kept" in err
    unchanged()
    # Killed before its first checkpoint: the old run stands, the staging folder goes.
    killed = subprocess.run(mcfl_killed_at(FaultPlan("row", 1), "run", *FLAGS, "--seed", "3",
                                           "--out", str(out), "--overwrite"),
                            capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    assert (tmp_path / ".run.mcfl-new").is_dir()
    assert main(["run", *FLAGS, "--out", str(out)]) == 2  # still holds the (old) run
    assert "already holds a run" in capsys.readouterr().err
    unchanged()
    # Killed halfway through the swap: resuming finishes the swap, then the run.
    killed = subprocess.run(mcfl_killed_at(FaultPlan("swap", 2), "run", *FLAGS, "--out",
                                           str(out), "--overwrite"), capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    assert (out / ".mcfl-replacing").is_file()
    assert main(["run", "--resume", str(out)]) == 0
    assert_same_run(whole, out)
    assert not (out / ".mcfl-replacing").exists()
    assert not (tmp_path / ".run.mcfl-new").exists()


def test_a_resumed_run_keeps_its_checkpoint_interval(tmp_path, monkeypatch):
    config = mcfl.RunConfig(clients=6, rounds=10, clients_per_round=3)
    with pytest.raises(KeyboardInterrupt):
        mcfl.run(config, out_dir=tmp_path, checkpoint_every=3, observers=(SignalAt(4),))
    saved = []
    original = checkpoint.Checkpoints.save
    monkeypatch.setattr(checkpoint.Checkpoints, "save",
                        lambda self, r, *a: (saved.append(r), original(self, r, *a)))
    mcfl.run(resume=tmp_path)
    assert saved == [6, 9, 10]  # every 3 rounds, as the run was started, and at the end


def test_a_stop_before_the_first_round_leaves_nothing_to_refuse(tmp_path, capsys):
    """Ctrl-C before round 1 (Python's KeyboardInterrupt, raised where the default handler
    would raise it: a test worker may ignore SIGINT itself): the new folder is removed again,
    so the same command starts the run afresh."""
    class StopAtStart(mcfl.RunObserver):
        def started(self, config, later_columns):
            raise KeyboardInterrupt

    config = mcfl.RunConfig(clients=6, rounds=2, clients_per_round=3)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        mcfl.run(config, out_dir=out, observers=(StopAtStart(),))
    assert not out.exists()
    mcfl.run(config, out_dir=out)
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


def test_a_second_signal_during_a_checkpoint_stops_after_it():
    reached_end_of_save = False
    with checkpoint.StopRequests() as stops:
        signal.raise_signal(signal.SIGINT)  # the first asks for a stop at the chunk's end
        with pytest.raises(KeyboardInterrupt):
            with stops.deferred():
                signal.raise_signal(signal.SIGINT)  # the second waits for the save
                reached_end_of_save = True
    assert reached_end_of_save


def test_bad_data_and_runs_too_large_are_refused_before_any_output(tmp_path, capsys,
                                                                    monkeypatch):
    out = tmp_path / "run"
    assert main(["run", "--dataset", "leaf", "--data-dir", str(tmp_path / "none"),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mcfl: error:"), err  # no progress bar
    assert not out.exists()
    (tmp_path / "file").write_text("")
    assert main(["run", "--out", str(tmp_path / "file" / "run")]) == 2
    err = capsys.readouterr().err
    assert f"cannot write the output folder '{tmp_path / 'file' / 'run'}': " \
           f"'{tmp_path / 'file'}' is not a writable folder" in err, err
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "16G")
    started = time.perf_counter()
    assert main(["run", "--clients", "1000000", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert time.perf_counter() - started < 30  # refused from the config, nothing built
    assert ("synthetic with 1,000,000 clients needs about 111.7 GiB of host memory for its "
            "data; 16.0 GiB is available: use at most about 143,") in err, err
    assert err.count("\n") == 1 and not out.exists()
    # A run whose data fit but whose clients' state does not (Local keeps a model a client).
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "12M")
    assert main(["run", "--algorithm", "local", "--model", "mlp", "--clients", "40",
                 "--rounds", "1", "--no-cache", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    # (for its clients' state, or for a round's temporaries: XLA's figures say which first)
    assert "local on 40 clients needs about" in err and "more memory for " in err, err
    assert err.count("\n") == 1 and not out.exists()
    assert "--devices" not in err  # (the run has every device already)


@pytest.mark.parametrize("config", [
    mcfl.RunConfig(clients=300, seed=4),
    mcfl.RunConfig(clients=300, data_seed=9),
    mcfl.RunConfig(dataset="digits", clients=30),
])
def test_the_data_estimate_is_the_bytes_the_dataset_takes(config):
    import jax

    built = mcfl.load_dataset(config)
    actual = sum(x.nbytes for x in jax.tree.leaves(built.arrays))
    assert memory.data_bytes(mcfl.resolve(config).data).device == pytest.approx(actual,
                                                                              rel=0.01)


def test_out_of_memory_errors_are_one_line():
    numpy_error = MemoryError("Unable to allocate 44.7 GiB for an array with shape "
                              "(10000000, 60, 10) and data type float64")
    xla_error = RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 97973550960 "
                             "bytes.\nmore detail")
    for error in (numpy_error, xla_error):
        found = memory.out_of_memory(error)
        assert isinstance(found, mcfl.McflError) and "\n" not in str(found)
        assert str(found).startswith("out of memory (")
    assert memory.out_of_memory(ValueError("something else")) is None
    assert memory.parse_size("512M") == 512 * 2**20
    with pytest.raises(mcfl.ConfigError, match="is not a size in bytes"):
        memory.parse_size("lots")


def test_a_memory_limit_holds_inside_its_block_and_the_command_line_reads_the_variable(
        monkeypatch, capsys, tmp_path):
    """`memory.limited` sets the budget for its block only; MCFL_MEMORY_LIMIT is the command
    line's (read by mcfl.apps.user_environment and handed to `limited`), not read by the
    library, and a value that is no size is one line from the command line."""
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "1M")
    assert memory.host_available() > 2**20  # the library does not read the variable
    assert user_environment.memory_limit() == 2**20
    with memory.limited("12M") as limit:
        assert limit == 12 * 2**20 and memory.host_available() == limit
        assert memory.device_available(resident=2**20) <= 11 * 2**20
        with memory.limited(None):
            assert memory.host_available() > 12 * 2**20
        assert memory.host_available() == limit
    assert memory.host_available() > 2**20
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "lots")
    assert main(["run", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err == "mcfl: error: MCFL_MEMORY_LIMIT='lots' is not a size in bytes (e.g. 8G, " \
                  "512M, 1e9)\n" and not (tmp_path / "run").exists()


def test_more_devices_are_advised_only_where_the_run_leaves_some(monkeypatch):
    monkeypatch.setattr(memory.jax, "devices", lambda: [object()] * 4)
    monkeypatch.setattr(memory, "device_available", lambda resident=0: 2**30)
    for devices, advice in [(2, "or more devices (--devices up to 4)"), (None, None)]:
        with pytest.raises(mcfl.McflError) as raised:
            memory.check_program_fits(2**31, "a round", "fedavg on 10 clients", devices)
        text = str(raised.value)
        assert "needs about 2.0 GiB more memory for a round; 1.0 GiB is available" in text
        assert (advice in text) if advice else "--devices" not in text
