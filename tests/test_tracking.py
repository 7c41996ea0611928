"""Experiment tracking (`mcfl.tracking`, --log): what TensorBoard, MLflow and W&B hold after a
run, read back with each library's own reader, offline; a sweep's members as runs grouped by
grid point; the --log errors. A test whose library is not installed is skipped."""

from __future__ import annotations

import csv
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

import mcfl
from mcfl import load_dataset, tracking
from mcfl.apps.cli import main
from mcfl.errors import ConfigError, TrainingDivergedError
from mcfl.tracking.base import hyperparameters, round_metrics, summary_metrics

CONFIG = mcfl.RunConfig(dataset="synthetic", model="mclr", clients=8, rounds=3,
                        clients_per_round=4, eval_every=2, embed_clients=0)
SMALL = ["--clients", "8", "--rounds", "2", "--clients-per-round", "4", "--embed-clients", "0"]


@pytest.fixture(scope="module")
def dataset():
    return load_dataset(CONFIG)


def series(rows, key):
    """(round, value) of every row that has `key`."""
    return [(row["round"], row[key]) for row in rows if key in row]


def test_numbers_logged_are_a_rows_numbers_and_the_summarys():
    row = {"round": 4, "train_loss": 0.5, "comm_params_total": 120, "cluster_sizes": "6 2",
           "clients_waiting": 0}
    assert round_metrics(row) == {"train_loss": 0.5, "comm_params_total": 120.0,
                                  "clients_waiting": 0.0}
    summary = {"status": "completed", "config": {"lr": 0.1}, "dataset": {"clients": 8},
               "low_rank": False, "paper_best_accuracy_micro": None, "wall_seconds": 2.5}
    assert summary_metrics(summary) == {"summary/dataset/clients": 8.0,
                                        "summary/wall_seconds": 2.5}
    params = hyperparameters(CONFIG)
    assert params["hidden"] == "[200, 200]" and params["data_seed"] == "None"
    assert params["lr"] == 0.01 and params["scan_rounds"] == "auto"


def test_tensorboard_event_file_holds_the_rows_config_summary_and_plot(tmp_path, dataset):
    pytest.importorskip("tensorboard", reason="needs the tensorboard package (mcfl[tensorboard])")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    result = mcfl.run(CONFIG, dataset=dataset,
                      observers=[mcfl.tracking.TensorBoard(tmp_path / "tb")])
    events = EventAccumulator(str(tmp_path / "tb"),
                              size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    keys = {k for row in result.rounds for k in round_metrics(row)}
    summary = summary_metrics(result.summary)
    assert set(events.Tags()["scalars"]) == keys | set(summary)
    for key in keys:  # scalars are 32-bit floats in TensorBoard
        got = [(e.step, e.value) for e in events.Scalars(key)]
        assert got == [(r, float(np.float32(v))) for r, v in series(result.rounds, key)], key
    assert "accuracy_micro" not in result.rounds[0]  # evaluated rounds only: 2 and 3
    assert [e.step for e in events.Scalars("accuracy_micro")] == [2, 3]
    final = events.Scalars("summary/final_accuracy_micro")
    assert [(e.step, e.value) for e in final] == [
        (3, float(np.float32(result.summary["final_accuracy_micro"])))]
    start = metadata.parse_session_start_info_plugin_data(
        events.PluginTagToContent("hparams")["_hparams_/session_start_info"])
    logged = {k: getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
    assert logged == hyperparameters(CONFIG) and start.group_name == "fedavg-synthetic-c8-s0"
    (image,) = events.Images("plots/curves")
    assert image.step == 3 and image.encoded_image_string.startswith(b"\x89PNG")
    assert image.width > 400 and image.height > 200


def _mlflow_file_store(monkeypatch):
    """MLflow's defaults as on a fresh machine: no tracking URI, no experiment, the file store
    not yet allowed (the tracker allows it); the variable it sets is undone after the test."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # recorded, so that the delete is undone
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")


def test_mlflow_file_store_holds_the_metrics_params_summary_and_plot(tmp_path, monkeypatch,
                                                                    dataset):
    pytest.importorskip("mlflow", reason="needs the mlflow package (mcfl[mlflow])")
    from mlflow.tracking import MlflowClient

    _mlflow_file_store(monkeypatch)
    monkeypatch.chdir(tmp_path)
    tracker = mcfl.tracking.from_spec("mlflow")  # ./mlruns
    result = mcfl.run(CONFIG, dataset=dataset, observers=[tracker])
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "fedavg-synthetic-c8-s0"
    assert client.get_experiment(run.info.experiment_id).name == "mcfl"
    assert run.data.params == {k: str(v) for k, v in hyperparameters(CONFIG).items()}
    assert run.data.tags["status"] == "completed"
    keys = {k for row in result.rounds for k in round_metrics(row)}
    for key in keys:
        got = [(m.step, m.value) for m in client.get_metric_history(tracker.run_id, key)]
        assert sorted(got) == series(result.rounds, key), key
    summary = summary_metrics(result.summary)
    assert set(run.data.metrics) == keys | set(summary)
    assert run.data.metrics["summary/final_accuracy_micro"] == result.summary[
        "final_accuracy_micro"]
    artifacts = {a.path for a in client.list_artifacts(tracker.run_id)}
    assert artifacts == {"summary.json", "plots"}
    assert [a.path for a in client.list_artifacts(tracker.run_id, "plots")] == [
        "plots/curves.png"]
    saved = json.loads(Path(client.download_artifacts(tracker.run_id, "summary.json",
                                                      str(tmp_path))).read_text())
    assert saved["final_f1_macro"] == result.summary["final_f1_macro"]
    assert saved["config"] == CONFIG.to_dict()


def test_a_diverged_run_ends_its_mlflow_run_failed(tmp_path, monkeypatch, dataset):
    pytest.importorskip("mlflow", reason="needs the mlflow package (mcfl[mlflow])")
    from mlflow.tracking import MlflowClient

    _mlflow_file_store(monkeypatch)
    tracker = mcfl.tracking.MLflow(str(tmp_path / "store"), experiment="diverging")
    with pytest.raises(TrainingDivergedError):
        mcfl.run(CONFIG.replace(lr=1e30), dataset=dataset, observers=[tracker])
    run = MlflowClient((tmp_path / "store").as_uri()).get_run(tracker.run_id)
    assert run.info.status == "FAILED" and run.data.tags["status"] == "diverged"


def wandb_records(path):
    """The records of a W&B run file (run-ID.wandb): after its 7-byte header (":W&B", a key,
    a version), LevelDB's log format, blocks of 32 KiB holding chunks (a 7-byte header: a
    checksum, the length, the type: 1 whole, 2 first, 3 middle, 4 last), each record a
    `wandb_internal_pb2.Record`."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little left in the block for a header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _items(entries) -> dict:
    return {e.key or "/".join(e.nested_key): json.loads(e.value_json) for e in entries}


def test_wandb_offline_run_holds_the_history_config_and_summary(tmp_path, monkeypatch,
                                                                 dataset):
    pytest.importorskip("wandb", reason="needs the wandb package (mcfl[wandb])")
    for name, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path),
                        "WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}.items():
        monkeypatch.setenv(name, value)
    result = mcfl.run(CONFIG, dataset=dataset, observers=[mcfl.tracking.WandB("mcfl-tests")])
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.project == "mcfl-tests" and run.display_name == "fedavg-synthetic-c8-s0"
    config = _items(run.config.update)
    assert {k: v for k, v in config.items() if k != "_wandb"} == CONFIG.to_dict()
    history: dict[int, dict] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = _items(r.history.item)
            history.setdefault(items["_step"], {}).update(items)
    assert sorted(history) == [1, 2, 3]
    for row in result.rounds:
        logged = history[row["round"]]
        assert {k: logged[k] for k in round_metrics(row)} == round_metrics(row)
    assert history[3]["plots/curves/_type"] == "image-file"  # (an image's fields, flattened)
    assert (run_file.parent / "files" / history[3]["plots/curves/path"]).is_file()
    summary: dict = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update(_items(r.summary.update))
    assert summary["status"] == "completed"
    assert summary["final_accuracy_micro"] == result.summary["final_accuracy_micro"]
    assert summary["dataset/clients"] == 8
    (end,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert end.exit_code == 0


def test_sweep_logs_a_run_per_member_grouped_by_grid_point(tmp_path, monkeypatch):
    """`mcfl sweep --log`: 4 members (2 grid points x 2 seeds, in chunks of 3: the padding's
    rows are nobody's) are 4 TensorBoard folders GRID_POINT/seed-S and 4 MLflow runs tagged
    with their grid point and seed, each holding its member's rows of rounds.csv."""
    pytest.importorskip("tensorboard", reason="needs the tensorboard package (mcfl[tensorboard])")
    pytest.importorskip("mlflow", reason="needs the mlflow package (mcfl[mlflow])")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _mlflow_file_store(monkeypatch)
    tb, store, out = tmp_path / "tb", tmp_path / "mlruns", tmp_path / "sweep"
    assert main(["sweep", *SMALL, "--seeds", "0,1", "--grid", "lr=0.01,0.05",
                 "--members-per-chunk", "3", "--out", str(out), "--log", f"tensorboard:{tb}",
                 "--log", f"mlflow:{store}"]) == 0
    with open(out / "rounds.csv") as f:
        rows = list(csv.DictReader(f))
    members = {(f"lr={lr}", f"seed-{seed}") for lr in ("0.01", "0.05") for seed in (0, 1)}
    assert {(p.parent.name, p.name) for p in tb.glob("*/*")} == members
    client = MlflowClient(store.as_uri())
    runs = client.search_runs([client.get_experiment_by_name("mcfl").experiment_id])
    assert {(r.data.tags["grid_point"], r.info.run_name) for r in runs} == members
    for run in runs:
        point, seed = run.data.tags["grid_point"], run.data.tags["seed"]
        own = [(int(r["round"]), float(r["train_loss"])) for r in rows
               if f"lr={r['lr']}" == point and r["seed"] == seed]
        assert len(own) == 2 and run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "train_loss")
        assert sorted((m.step, m.value) for m in history) == own
        events = EventAccumulator(str(tb / point / f"seed-{seed}"))
        events.Reload()
        assert [(e.step, e.value) for e in events.Scalars("train_loss")] == [
            (r, float(np.float32(v))) for r, v in own]


@pytest.mark.parametrize("spec, message", [
    ("foo", "mcfl: error: unknown --log 'foo'; allowed: tensorboard:DIR, mlflow, mlflow:URI, "
            "wandb, wandb:PROJECT"),
    ("tensorboard", "mcfl: error: --log 'tensorboard' needs a folder: tensorboard:DIR"),
])
def test_a_bad_log_is_one_line_exit_2(tmp_path, capsys, spec, message):
    assert main(["run", *SMALL, "--log", spec, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1 and not (tmp_path / "run").exists()


def test_a_missing_library_is_one_line_before_the_run_starts(tmp_path, capsys, monkeypatch):
    """Without mlflow (hidden from the import system), --log mlflow is refused before the
    data are loaded: one line naming the extra, exit 2, no run folder."""
    monkeypatch.setitem(sys.modules, "mlflow", None)  # (an import of it fails)
    assert main(["run", *SMALL, "--log", "mlflow", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == ("mcfl: error: --log mlflow needs the mlflow package: "
                                       "pip install 'mcfl[mlflow]'\n")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("spec, message", [
    ("mlflow:", "--log 'mlflow:' names nothing after the colon; allowed: tensorboard:DIR"),
    ("wandb: ", "--log 'wandb: ' names nothing after the colon"),
    ("TensorBoard:x", "unknown --log 'TensorBoard:x'; allowed: "),
])
def test_bad_specs_are_config_errors(spec, message, capsys):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")):
        tracking.from_spec(spec)
    assert main(["sweep", *SMALL, "--log", spec]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_sweep_observers_must_make_member_observers():
    with pytest.raises(ConfigError, match="one observer per member"):
        mcfl.sweep(CONFIG, observers=[mcfl.RunObserver()])
