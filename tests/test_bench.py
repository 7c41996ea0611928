"""`mcfl bench`: the benchmark data, one measured point, a sweep that survives failures, and the
command line's errors. Tiny sizes (20 clients, 2 rounds, MCLR) to stay fast."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from mcfl.apps import bench, bench_data, bench_point
from mcfl.apps.cli import main

TINY = {"model": "mclr", "clients": 20, "rounds": 2}


def test_every_client_holds_exactly_rows_per_client_and_the_data_is_seeded():
    data = bench_data.benchmark_dataset(30, 7, rows_per_client=12, test_rows_per_client=3, seed=4)
    assert data.num_clients == 30 and data.feature_shape == (7,) and data.num_classes == 10
    assert (data.train_counts() == 12).all() and (data.test_counts() == 3).all()
    assert np.array_equal(data.true_cluster, np.arange(30) % 4)
    again = bench_data.benchmark_dataset(30, 7, rows_per_client=12, test_rows_per_client=3, seed=4)
    other = bench_data.benchmark_dataset(30, 7, rows_per_client=12, test_rows_per_client=3, seed=5)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert np.array_equal(getattr(data.arrays, name), getattr(again.arrays, name))
    assert not np.array_equal(data.arrays.x_train, other.arrays.x_train)


def test_fill_mixture_draws_rows_around_their_centers():
    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0], [100.0, -100.0]], np.float32)
    component = np.arange(5000) % 2
    out = bench_data.fill_mixture(rng, np.empty((5000, 2), np.float32), centers, component,
                                   scale=2.0)
    for k in (0, 1):
        rows = out[component == k]
        assert np.allclose(rows.mean(0), centers[k], atol=0.5)
        assert np.all((1.5 < rows.std(0)) & (rows.std(0) < 2.5))


def test_a_training_point_reports_times_throughput_and_memory():
    record = bench_point.measure_point(bench.Point("fedavg", **TINY))
    assert record["status"] == "ok" and record["kind"] == "train"
    assert len(record["round_seconds"]) == 2
    assert record["first_round_seconds"] > 0 and record["seconds_per_round"] > 0
    assert record["local_steps"] == 5 and record["clients_per_round"] == 20  # 50 rows, B = 10
    assert record["samples_per_round"] == 20 * 5 * 10
    assert record["samples_per_second"] == pytest.approx(1000 / record["seconds_per_round"])
    assert record["num_params"] == 60 * 10 + 10 and record["block_size"] >= 1
    assert 0 < record["data_peak_rss_mb"] <= record["peak_rss_mb"]
    assert 0 <= record["final_accuracy_micro"] <= 1
    assert record["config"]["clients_per_round"] == 1.0 and record["config"]["local_steps"] == 5


def test_the_clustering_point_times_kmeans_on_one_vector_per_client():
    record = bench_point.measure_point(bench.Point(bench.CLUSTERING, **TINY))
    assert record["kind"] == "clustering" and record["num_params"] == 610
    assert record["restarts"] == 20 and record["lloyd_iterations"] >= 1
    assert record["seconds_per_round"] > 0 and record["peak_rss_mb"] > 0


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path):
    bad = bench.Point("fedavg", "mclr", 20, rounds=0)  # the child's RunConfig rejects it
    good = bench.Point("fedavg", **TINY)
    lines = []
    document = bench.run_sweep([bad, good], tmp_path, timeout=300, report=lines.append)
    failed, ok = document["points"]
    assert failed["status"] == "failed" and "rounds must be an integer >= 1" in failed["error"]
    assert ok["status"] == "ok" and ok["samples_per_second"] > 0
    assert json.loads((tmp_path / "bench.json").read_text()) == json.loads(json.dumps(document))
    assert document["machine"]["backend"] == "cpu" and document["machine"]["cpu_count"] >= 1
    assert (tmp_path / "bench.png").stat().st_size > 1000
    assert "FAILED" in bench.format_row(failed) and "ok" in bench.format_row(ok)
    assert len(lines) == 2


def test_a_point_over_its_timeout_or_killed_is_a_failure():
    record = bench.run_point(bench.Point("fedavg", **TINY), timeout=0.2)
    assert record["status"] == "failed" and record["error"] == "timed out after 0.2 s"
    assert bench.failure_message(-9, "") == "killed by SIGKILL (out of memory?)"
    assert bench.failure_message(1, "Traceback\n  ...\nValueError: bad\n") == "ValueError: bad"


@pytest.mark.parametrize("turned_off", [None, "--no-compile-cache", "MCFL_NO_COMPILE_CACHE"])
def test_the_compile_cache_choice_reaches_each_child_on_its_command_line(tmp_path, monkeypatch,
                                                                        turned_off):
    """`mcfl bench --no-compile-cache` (or MCFL_NO_COMPILE_CACHE=1, read by the command line)
    hands each child point its own --no-compile-cache; this process's environment is left as
    it was (the children are not run here: their command lines are recorded)."""
    commands = []

    def recorded(command, **kwargs):
        commands.append(command)
        return subprocess.CompletedProcess(command, 1, "", "ValueError: not run here")

    monkeypatch.setattr(bench.subprocess, "run", recorded)
    monkeypatch.delenv("MCFL_NO_COMPILE_CACHE", raising=False)
    argv = ["bench", "--algorithms", "fedavg", "--models", "mclr", "--clients", "20",
            "--rounds", "2", "--out", str(tmp_path)]
    if turned_off == "--no-compile-cache":
        argv.append(turned_off)
    elif turned_off:
        monkeypatch.setenv(turned_off, "1")
    before = dict(os.environ)
    assert main(argv) == 0
    assert dict(os.environ) == before
    assert len(commands) == 2  # fedavg and the clustering step
    assert all(("--no-compile-cache" in command) == (turned_off is not None)
               for command in commands)


def test_the_default_sweep_runs_the_mlp_up_to_10000_clients():
    points, skipped = bench.plan_points(
        ("fedavg", "flexcfl"), ("mclr", "mlp"), bench.DEFAULT_CLIENTS,
        max_mlp_clients=bench.MLP_DEFAULT_MAX_CLIENTS,
    )
    assert {(p.model, p.clients) for p in points if p.algorithm == bench.CLUSTERING} == {
        ("mclr", 100), ("mclr", 1_000), ("mclr", 10_000), ("mclr", 100_000),
        ("mlp", 100), ("mlp", 1_000), ("mlp", 10_000),
    }
    assert len(points) == 7 * 3 and len(skipped) == 1 and "mlp at 100,000" in skipped[0]
    flexcfl = bench.training_config(bench.Point("flexcfl", "mclr", 100))
    assert flexcfl.pretrain_scale * flexcfl.clusters <= 100
    assert flexcfl.clients_per_round == 1.0 and flexcfl.eval_every == flexcfl.rounds
    # Partial participation: a count, capped at the point's clients, or a fraction.
    assert bench.training_config(bench.Point("fedavg", "mclr", 100, clients_per_round=20)
                                 ).clients_per_round == 20
    assert bench.training_config(bench.Point("fedavg", "mclr", 10, clients_per_round=20)
                                 ).clients_per_round == 10
    assert bench.training_config(bench.Point("fedavg", "mclr", 100, clients_per_round=0.5)
                                 ).clients_per_round == 0.5


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--algorithms", "fedavg,nope"], "unknown algorithm 'nope'; allowed: fedavg"),
        (["--models", "cnn-leaf"], "unknown model 'cnn-leaf'; allowed: mclr, mlp, cnn-fmnist"),
        (["--clients-per-round", "0"], "clients_per_round must be between 1 and"),
        (["--clients-per-round", "1.5"], "clients_per_round as a fraction must be in (0, 1]"),
        (["--clients", "100,0"], "client counts must be positive integers, got '0'"),
        (["--clients", "100,ten"], "client counts must be positive integers, got 'ten'"),
        (["--clients", "2", "--algorithms", "ifca"],
         "--clusters 4 (K) cannot exceed the number of clients (2)"),
        (["--rounds", "0"], "--rounds must be >= 1"),
        (["--timeout", "-1"], "--timeout must be > 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, argv, message):
    assert main(["bench", *argv, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mcfl: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "b").exists()


def _regression_guard():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "benchmarks" / "regression.py"
    spec = importlib.util.spec_from_file_location("regression_guard", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_regression_guard_pairs_its_sides_and_refuses_a_busy_machine(tmp_path, capsys):
    """benchmarks/regression.py: ratios current / baseline per repeat, their median and range
    (hand values; a repeat with one side missing is no pair); it refuses to start above
    --max-load (exit 3, nothing measured) and refuses bad input in one line (exit 2)."""
    guard = _regression_guard()
    measured = [(0, "baseline", 2.0), (0, "current", 1.0), (1, "current", 3.0),
                (1, "baseline", 2.0), (2, "baseline", 4.0), (3, "current", 9.0)]
    document = {"measurements": [{"repeat": r, "workload": "cnn-round", "side": side,
                                  "seconds_per_round": s} for r, side, s in measured]
                + [{"repeat": 0, "workload": "full-mlp", "side": "current", "error": "x"}]}
    cnn, mlp = guard.summarise(document, ["cnn-round", "full-mlp"])
    assert cnn["pairs"] == 2 and cnn["ratio"] == pytest.approx(1.0)  # median of 0.5 and 1.5
    assert (cnn["ratio_min"], cnn["ratio_max"]) == (0.5, 1.5)
    assert cnn["baseline_s"] == 2.0 and cnn["current_s"] == 3.0  # medians of each side's runs
    assert mlp["ratio"] is None and mlp["pairs"] == 0
    out = tmp_path / "guard"
    assert guard.main(["--baseline", "HEAD", "--max-load", "-1", "--out", str(out)]) == 3
    assert "refused: the 1-minute load average" in capsys.readouterr().err
    assert not (out / "regression.json").exists()
    assert guard.main(["--baseline", "no-such-revision", "--force", "--out", str(out)]) == 2
    assert "'no-such-revision' is not a commit" in capsys.readouterr().err
    assert guard.main(["--baseline", "HEAD", "--workloads", "cnn,resnet", "--out",
                       str(out)]) == 2
    assert "expected names among cnn-round" in capsys.readouterr().err
