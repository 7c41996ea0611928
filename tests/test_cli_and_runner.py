"""The command line and `mcfl.run`: outputs, config handling, bad input, NaN, recompiles."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import mcfl
import mcfl.data
import mcfl.runs.program
import mcfl.runs.records
from mcfl.algorithms.framework.base import FederatedAlgorithm, wrapping
from mcfl.apps.cli import main


def _csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


SMALL = ["--clients", "8", "--rounds", "3", "--clients-per-round", "4", "--seed", "1"]


def test_run_writes_summary_rounds_clients_and_plot(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--algorithm", "fedprox", "--mu", "0.1", *SMALL, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["config"]["algorithm"] == "fedprox" and summary["config"]["mu"] == 0.1
    for key in ("accuracy_micro", "accuracy_macro", "f1_micro", "f1_macro"):
        assert 0 <= summary[f"final_{key}"] <= summary[f"best_{key}"] <= 1
    assert summary["wall_seconds"] > 0 and summary["seconds_per_round"] > 0
    rounds = _csv(out / "rounds.csv")
    assert [int(r["round"]) for r in rounds] == [1, 2, 3]
    assert float(rounds[-1]["accuracy_micro"]) == pytest.approx(summary["final_accuracy_micro"])
    clients = _csv(out / "clients.csv")
    assert len(clients) == 8
    assert {"client_id", "n_train", "n_test", "accuracy"} <= set(clients[0])
    assert (out / "curves.png").stat().st_size > 1000
    assert "accuracy micro" in capsys.readouterr().out


def test_config_file_with_flag_override(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'algorithm = "local"\nclients = 8\nrounds = 2\nlocal_steps = 3\nclients_per_round = 0.5\n'
    )
    out = tmp_path / "run"
    assert main(["run", "--config", str(cfg), "--rounds", "1", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["algorithm"] == "local"
    assert summary["rounds_completed"] == 1  # the flag wins over the file
    assert summary["clients_per_round"] == 4  # 0.5 of 8 clients


def test_python_api_writes_nothing_unless_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = mcfl.run(mcfl.RunConfig(clients=6, rounds=2, clients_per_round=3, eval_every=2))
    assert list(tmp_path.iterdir()) == []
    assert [r["round"] for r in result.rounds] == [1, 2]
    assert "accuracy_micro" not in result.rounds[0] and "accuracy_micro" in result.rounds[1]
    assert len(result.clients) == 6 and result.summary["final_accuracy_micro"] is not None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--algorithm", "fedmagic"], "unknown algorithm 'fedmagic'; allowed: fedavg, fedprox"),
        (["--dataset", "imagenet"], "unknown dataset 'imagenet'; allowed: synthetic"),
        (["--model", "resnet"], "unknown model 'resnet'; allowed: mclr, mlp"),
        (["--clients", "0"], "clients must be an integer >= 1, got 0"),
        (["--rounds", "0"], "rounds must be an integer >= 1, got 0"),
        (["--batch-size", "0"], "batch_size must be an integer >= 1, got 0"),
        (["--clients", "5", "--clients-per-round", "9"], "between 1 and the 5 clients, got 9"),
        (["--mu", "0.1"], "mu applies to fedprox, feddane, not 'fedavg'"),
        (["--algorithm", "fedprox", "--mu", "nan"], "mu must be a finite number, got nan"),
        (["--lr", "inf"], "lr must be a finite number, got inf"),
        (["--seed", "-1"], "seed must be an integer >= 0"),
        (["--seed", "99999999999999999999"], "seed must be an integer >= 0 and <= "),
        (["--fesem-lambda", "0.1"],
         "fesem_lambda applies to fesem, fesem_ma, dp_fesem, not 'fedavg'"),
        (["--clients", "ten"], "argument --clients: invalid int value: 'ten'"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, message, capsys):
    try:
        code = main(["run", *argv])
    except SystemExit as e:  # argparse's own type errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_unknown_config_key_is_named(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"learning_rate": 0.1}))
    assert main(["run", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "unknown config key(s) 'learning_rate'; allowed: algorithm, rounds" in err


def test_console_entry_point_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "mcfl", "run", "--algorithm", "nope"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("mcfl: error: unknown algorithm 'nope'")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("disable", [None, "--no-compile-cache", "MCFL_NO_COMPILE_CACHE"])
def test_compile_cache_is_on_by_default_and_can_be_turned_off(tmp_path, disable):
    """`mcfl run` keeps its compiled programs under the cache dir's jax-compile/ (a repeated
    run loads them instead of compiling), unless the flag or the variable say no."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(MCFL_CACHE_DIR=str(tmp_path / "cache"))
    argv = [sys.executable, "-m", "mcfl", "run", "--clients", "4", "--rounds", "1",
            "--out", str(tmp_path / "run")]
    if disable == "--no-compile-cache":
        argv.append(disable)
    elif disable:
        env[disable] = "1"
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    entries = list((tmp_path / "cache" / "jax-compile").glob("*"))
    assert (len(entries) > 0) == (disable is None)


def _poisoned(algorithm: FederatedAlgorithm, bad_from_round: int) -> FederatedAlgorithm:
    """Wrap an algorithm so that its train loss turns NaN from round `bad_from_round` on."""

    def init(data, key, hp):
        return (algorithm.init(data, key, hp), jnp.zeros((), jnp.int32))

    def round_(state, data, key, hp, exchange):
        inner, count = state
        inner, metrics, exchange = algorithm.round(inner, data, key, hp, exchange)
        count = count + 1
        metrics["train_loss"] = jnp.where(count >= bad_from_round, jnp.nan, metrics["train_loss"])
        return (inner, count), metrics, exchange

    return wrapping(algorithm, init, round_,
                    lambda s, *a: algorithm.participants(s[0], *a))


def test_nan_stops_with_clear_error_and_keeps_finished_rounds(tmp_path, monkeypatch, capsys,
                                                              wrap_algorithm):
    wrap_algorithm(lambda algorithm: _poisoned(algorithm, bad_from_round=3))
    out = tmp_path / "run"
    assert main(["run", *SMALL, "--rounds", "5", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "training diverged in round 3: non-finite train_loss=nan" in err
    # a concrete smaller step (a tenth of the run's 0.01), not the value the run had; the
    # server's step of 1 (plain averaging) is not blamed
    assert "rounds 1-2 were kept" in err
    assert "Try a smaller step, --lr 0.001 (a tenth of 0.01)" in err
    assert "server-lr" not in err
    rounds = _csv(out / "rounds.csv")
    assert [int(r["round"]) for r in rounds] == [1, 2]
    assert json.loads((out / "summary.json").read_text())["status"] == "diverged"


def test_seeds_beyond_32_bits_get_keys_of_their_own():
    import jax
    import numpy as np

    from mcfl.runs.execution import seed_key

    data = [tuple(np.asarray(jax.random.key_data(seed_key(s)))) for s in
            (0, 1, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**63 - 2**32)]
    assert len(set(data)) == len(data)  # jax.random.key alone gives key(2**40) == key(0)
    assert data[1] == tuple(np.asarray(jax.random.key_data(jax.random.key(1))))  # unchanged


def test_divergence_in_round_one_points_at_the_model_or_the_data_first():
    config = mcfl.RunConfig(algorithm="local", lr=0.5)  # no server step
    row = {"round": 1, "train_loss": float("inf"), "discrepancy": 0.5}
    text = mcfl.runs.records.divergence_message(mcfl.resolve(config), row, [])
    assert text == ("training diverged in round 1: non-finite train_loss=inf; no round was "
                    "kept. Values that are non-finite from the first round usually come from "
                    "the model or the data, not the learning rate: check that the model gives "
                    "finite logits and that the data hold no extreme values; if both are sound, "
                    "try a smaller step, --lr 0.05 (a tenth of 0.5)")


def test_divergence_later_advises_a_smaller_step_than_the_runs():
    """A concrete smaller --lr (a tenth of the run's), and the server's step back to plain
    averaging only where the run's is above 1."""
    rows = [{"round": 1, "train_loss": 2.0}, {"round": 2, "train_loss": 9.0}]
    row = {"round": 3, "train_loss": float("nan")}
    def message(config, row, rows):
        return mcfl.runs.records.divergence_message(mcfl.resolve(config), row, rows)

    assert message(mcfl.RunConfig(algorithm="fedavg", lr=0.03, server_lr=2.5), row, rows) == (
        "training diverged in round 3: non-finite train_loss=nan; rounds 1-2 were kept. Try a "
        "smaller step, --lr 0.003 (a tenth of 0.03) or --server-lr 1 (plain averaging; now "
        "2.5), or check the data for extreme values")
    assert "--server-lr" not in message(mcfl.RunConfig(algorithm="fedavg", server_lr=0.5),
                                        row, rows)


def test_runner_compiles_round_and_evaluation_once(monkeypatch, wrap_algorithm):
    from mcfl.algorithms.framework import device

    evaluate_counts = device.engine.evaluate_counts
    traces = {"round": 0, "evaluate": 0}

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            traces[name] += 1  # runs only when jax traces (compiles) the function
            return fn(*args, **kwargs)

        return wrapped

    def counted_build(algorithm):
        return algorithm._replace(round=counting("round", algorithm.round))

    wrap_algorithm(counted_build)
    monkeypatch.setattr(device.engine, "evaluate_counts", counting("evaluate", evaluate_counts))
    result = mcfl.run(mcfl.RunConfig(clients=8, rounds=4, clients_per_round=3))
    assert result.summary["rounds_completed"] == 4
    assert traces == {"round": 1, "evaluate": 1}  # 4 rounds, 4 evaluations, one trace each


def test_runs_with_other_seeds_reuse_the_compiled_program(monkeypatch, wrap_algorithm):
    """The seed reaches the program as keys: a second run of a config with another seed on the
    same data traces nothing and gives what a fresh program gives; another lr compiles anew."""
    traces = []

    def counted_build(algorithm):

        def round_(*a):
            traces.append(1)  # runs only when jax traces the round
            return algorithm.round(*a)

        return algorithm._replace(round=round_)

    wrap_algorithm(counted_build)
    config = mcfl.RunConfig(clients=8, rounds=2, clients_per_round=3, embed_clients=0)
    data = mcfl.load_dataset(config)
    mcfl.run(config, dataset=data)
    again = mcfl.run(config.replace(seed=1), dataset=data)
    assert len(traces) == 1
    mcfl.runs.program.forget_programs()
    fresh = mcfl.run(config.replace(seed=1), dataset=data)
    assert len(traces) == 2
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(again.rounds) == strip(fresh.rounds)
    mcfl.run(config.replace(lr=0.02), dataset=data)
    assert len(traces) == 3


def test_communication_hand_count_and_compare(tmp_path, capsys):
    """FedAvg: each of 3 sampled clients gets 1 model and sends 1 back; IFCA (K = 2) sends
    both models down to each. MCLR on Synthetic has d = 61 * 10 = 610 parameters."""
    d = 610
    common = ["--clients", "6", "--rounds", "2", "--clients-per-round", "3", "--no-cache"]
    assert main(["run", "--algorithm", "fedavg", *common, "--out", str(tmp_path / "a")]) == 0
    assert main(["run", "--algorithm", "ifca", "--clusters", "2", *common,
                 "--out", str(tmp_path / "b")]) == 0
    assert main(["run", "--algorithm", "local", *common, "--out", str(tmp_path / "c")]) == 0
    expected = {"a": (3 * d, 3 * d), "b": (3 * 2 * d, 3 * d), "c": (0, 0)}
    for run, (down, up) in expected.items():
        rounds = _csv(tmp_path / run / "rounds.csv")
        assert [int(r["comm_params_down"]) for r in rounds] == [down, down]
        assert [int(r["comm_params_up"]) for r in rounds] == [up, up]
        assert [int(r["comm_params_total"]) for r in rounds] == [down + up, 2 * (down + up)]
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert summary["comm_params_total"] == 2 * (down + up)
    capsys.readouterr()
    out = tmp_path / "cmp.png"
    runs = [str(tmp_path / r) for r in "abc"]
    assert main(["compare", "--runs", *runs, "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "a (fedavg)" in table and "b (ifca)" in table and f"{4 * 3 * d + 2 * 3 * d:.3g}" in table
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert main(["compare", "--runs", str(tmp_path)]) == 2  # not a run folder
    assert "summary.json is missing" in capsys.readouterr().err
    # two folders of the same name and algorithm: both shown, by path
    import shutil

    shutil.copytree(tmp_path / "a", tmp_path / "again" / "a")
    assert main(["compare", "--runs", str(tmp_path / "a"), str(tmp_path / "again" / "a"),
                 "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "a (fedavg)" in table and f"{tmp_path / 'again' / 'a'} (fedavg)" in table


@pytest.mark.parametrize("argv, message", [
    (["run", "--cache-dir", "{file}"], "--cache-dir '{file}' is a file; name a folder"),
    (["data", "plot", "--out", "x.txt"], "--out 'x.txt' must end in one of .png, .pdf"),
    (["compare", "--runs", "r", "--out", "c.txt"], "--out 'c.txt' must end in one of"),
    (["demo", "--rounds", "0"], "rounds must be an integer >= 1, got 0"),
    (["demo", "--clients", "0"], "clients must be an integer >= 1, got 0"),
])
def test_bad_paths_and_counts_are_one_line(tmp_path, monkeypatch, capsys, argv, message):
    afile = tmp_path / "afile"
    afile.write_text("")
    argv = [a.replace("{file}", str(afile)) for a in argv]
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message.replace("{file}", str(afile)) in err and err.count("\n") == 1, err


def test_dataset_passed_must_match_the_config():
    from mcfl import load_dataset

    data = load_dataset(mcfl.RunConfig(clients=6))
    with pytest.raises(mcfl.ConfigError, match="has 6 clients but the config says clients=8"):
        mcfl.run(mcfl.RunConfig(clients=8, rounds=1), dataset=data)


def test_profile_writes_a_trace(tmp_path):
    assert main(["run", *SMALL, "--no-cache", "--out", str(tmp_path / "run"),
                 "--profile", str(tmp_path / "trace")]) == 0
    assert list((tmp_path / "trace").rglob("*.xplane.pb"))
    # scanned: the second chunk (round 3 of chunks [1-2], [3]) is traced
    assert main(["run", *SMALL, "--no-cache", "--scan-rounds", "on", "--eval-every", "2",
                 "--out", str(tmp_path / "scanned"), "--profile", str(tmp_path / "trace2")]) == 0
    assert list((tmp_path / "trace2").rglob("*.xplane.pb"))


def test_round_chunks_end_at_each_evaluation():
    from mcfl.runs.loop import round_chunks

    assert round_chunks(3, 2, scanned=False) == [(1, 1), (2, 1), (3, 1)]
    assert round_chunks(5, 2, scanned=True) == [(1, 2), (3, 2), (5, 1)]
    assert round_chunks(6, 3, scanned=True) == [(1, 3), (4, 3)]
    assert round_chunks(2, 10, scanned=True) == [(1, 2)]


def test_scan_rounds_auto_scans_the_small_rounds_only():
    """``--scan-rounds auto`` scans a round under 1e9 training FLOPs by 6 x parameters x B x
    mean steps x clients a round (hand-computed); on / off are obeyed whatever the size."""
    from mcfl.engine import client_num_steps
    from mcfl.runs.execution import SCAN_BELOW_FLOPS, scans_rounds

    assert SCAN_BELOW_FLOPS == 1e9
    counts = jnp.asarray([10, 25, 50, 95])  # ceil(n / 10): 1, 3, 5, 10
    fixed = mcfl.RunConfig(local_steps=5, batch_size=10)
    assert float(np.mean(client_num_steps(counts, fixed))) == 5.0
    assert scans_rounds(fixed, 5.0, 610, 100)  # FeSEM's MCLR: 6 * 610 * 10 * 5 * 100 = 1.8e7
    assert not scans_rounds(fixed, 5.0, 199_210, 1000)  # the MLP, all of 1,000: 6.0e10
    assert not scans_rounds(fixed, 5.0, 610, 100_000)  # 1.8e10
    epochs = mcfl.RunConfig(local_epochs=2, batch_size=10)  # mean steps 2 * 19 / 4 = 9.5
    assert float(np.mean(client_num_steps(counts, epochs))) == 9.5
    assert scans_rounds(epochs, 9.5, 17_000, 100)  # 6 * 17,000 * 10 * 9.5 * 100 = 9.7e8
    assert not scans_rounds(epochs, 9.5, 18_000, 100)  # 1.03e9
    assert scans_rounds(fixed.replace(scan_rounds="on"), 5.0, 199_210, 1000)
    assert not scans_rounds(fixed.replace(scan_rounds="off"), 5.0, 610, 100)


def test_a_store_off_the_device_runs_round_by_round_under_auto():
    """A host store cannot scan (its rows are read and written between rounds): auto falls
    back to one round a call and says so."""
    config = mcfl.RunConfig(algorithm="local", clients=8, clients_per_round=4, rounds=4,
                            eval_every=2, client_store="host", embed_clients=0)
    run = mcfl.run(config)
    assert run.summary["client_store"] == "host"
    assert "one at a time" in run.summary["client_store_reason"]
    assert [r["round"] for r in run.rounds] == [1, 2, 3, 4]


def test_scanned_rounds_give_the_same_rows_and_compile_per_chunk_length(tmp_path, monkeypatch,
                                                                        wrap_algorithm):
    """IFCA (it records assignments) with --scan-rounds: the same rows, assignments and
    evaluations as round by round; 5 rounds evaluated every 2 are chunks of 2, 2 and 1 rounds,
    so the round is traced twice (one scan per chunk length), not per chunk."""
    common = ["--algorithm", "ifca", "--clusters", "2", *SMALL, "--rounds", "5",
              "--eval-every", "2", "--no-cache"]
    assert main(["run", *common, "--scan-rounds", "off", "--out", str(tmp_path / "loop")]) == 0
    traces = []

    def counted_build(algorithm):

        def round_(*a):
            traces.append(1)
            return algorithm.round(*a)

        return algorithm._replace(round=round_)

    wrap_algorithm(counted_build)
    assert main(["run", *common, "--scan-rounds", "on", "--out", str(tmp_path / "scan")]) == 0
    assert len(traces) == 2
    loop, scan = _csv(tmp_path / "loop" / "rounds.csv"), _csv(tmp_path / "scan" / "rounds.csv")
    assert [r["round"] for r in scan] == ["1", "2", "3", "4", "5"]
    for a, b in zip(loop, scan):
        assert a["cluster_sizes"] == b["cluster_sizes"]
        assert a["accuracy_micro"] == b["accuracy_micro"]  # "" where not evaluated
        assert float(a["train_loss"]) == pytest.approx(float(b["train_loss"]), rel=1e-5)
    summary = json.loads((tmp_path / "scan" / "summary.json").read_text())
    assert summary["config"]["scan_rounds"] == "on" and summary["rounds_completed"] == 5


def test_nan_inside_a_scanned_chunk_keeps_the_rounds_before_it(tmp_path, monkeypatch, capsys,
                                                               wrap_algorithm):
    wrap_algorithm(lambda algorithm: _poisoned(algorithm, bad_from_round=3))
    out = tmp_path / "run"
    assert main(["run", *SMALL, "--rounds", "5", "--eval-every", "5", "--scan-rounds", "on",
                 "--out", str(out)]) == 2
    assert "training diverged in round 3" in capsys.readouterr().err
    assert [int(r["round"]) for r in _csv(out / "rounds.csv")] == [1, 2]
    assert json.loads((out / "summary.json").read_text())["status"] == "diverged"


def test_a_folder_holding_a_run_is_refused_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "r"
    argv = ["run", "--clients", "12", "--rounds", "1", "--clients-per-round", "4", "--no-cache",
            "--no-compile-cache", "--out", str(out)]
    assert main(argv) == 0
    before = (out / "summary.json").read_text()
    capsys.readouterr()
    assert main(argv + ["--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run (run.json, summary.json, rounds.csv, clients.csv, " \
        "curves.png, checkpoints); pass --overwrite to replace it (or continue it with mcfl " \
        "run --resume" not in err
    assert "already holds a run (run.json, summary.json, rounds.csv, clients.csv, " \
        "curves.png, checkpoints); pass --overwrite to replace it, or choose another --out" in err
    assert err.count("\n") == 1
    assert (out / "summary.json").read_text() == before  # nothing lost
    (out / "notes.txt").write_text("mine")
    assert main(argv + ["--seed", "1", "--overwrite"]) == 0
    assert json.loads((out / "summary.json").read_text())["config"]["seed"] == 1
    assert (out / "notes.txt").read_text() == "mine"  # only mcfl's files are replaced
    (tmp_path / "file").write_text("x")
    assert main(argv[:-1] + [str(tmp_path / "file")]) == 2
    assert "is a file; choose another --out" in capsys.readouterr().err


def test_sigterm_keeps_the_rounds_and_writes_the_summary(tmp_path):
    import signal
    import time

    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcfl.apps.cli", "run", "--clients", "40", "--rounds", "100000",
         "--clients-per-round", "4", "--no-cache", "--no-compile-cache", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:  # wait for a few rounds on disk
        rounds = out / "rounds.csv"
        if rounds.is_file() and len(rounds.read_text().splitlines()) > 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    rows = (out / "rounds.csv").read_text().splitlines()
    assert summary["rounds_completed"] == len(rows) - 1 >= 3
