"""`mcfl bench --suite accelerator`: the workloads that matter on a GPU or a TPU, in one folder.

Each workload is a `Point` of `mcfl bench` (its own process; its round time, memory and, for
the headline training points, `mcfl plan`'s lower bound for this device beside it) or a cell of
FlexCFL's FashionMNIST-CNN table run with ``mcfl run`` at the full protocol (300 rounds of 20
clients, E = 10; experiments/flexcfl_table3_fmnist.toml). At ``--tiny`` every kind of workload
shrinks to a few clients and rounds and runs in this process (the table's cells on Synthetic(1,1)
with MCLR, which needs no data files), so the suite itself is tested on a CPU.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from mcfl.apps.bench import (
    child_env,
    failure_message,
    machine_info,
    plot_bench,
    run_point,
    write_json,
)
from mcfl.apps.bench_point import Point, measure_point, point_settings
from mcfl.config import from_dict, load_file
from mcfl.errors import McflError
from mcfl.files import atomic
from mcfl.runs.runner import run

SUITES = ("accelerator",)
TABLE_CELLS = ("fedavg", "ifca", "flexcfl")
TABLE_SETTING = "flexcfl_table3_fmnist"
BLOCK_SIZES = (8, 32, 128, 512)  # the scan beside the block size rule (None)


def accelerator_points(tiny: bool = False) -> list[Point]:
    """The suite's `Point`s (module docstring); `tiny`: the same workloads, CPU-test sized."""
    def scale(n: int) -> int:
        return max(4, n // 1000) if tiny else n

    rounds = 2 if tiny else 5
    cnn_clients = 4 if tiny else 200
    rows = 10 if tiny else 50  # a client's training rows (one step of B = 10 when tiny)
    # tiny: one of each repeated kind beyond the first (they share their code paths)
    members = (1, 2) if tiny else (1, 8, 32)
    block_sizes = BLOCK_SIZES[:1] if tiny else BLOCK_SIZES
    points = [
        Point("fedavg", "mlp", scale(10_000), rounds=rounds, label="fedavg-mlp-10k-a-round",
              plan=True),
        Point("fedavg", "cnn-fmnist", cnn_clients, rounds=rounds, clients_per_round=2 if tiny
              else 20, label="cnn-20-a-round", plan=True),
        Point("fedavg", "cnn-fmnist", cnn_clients, rounds=rounds, label="cnn-200-a-round",
              plan=True),
    ]
    points += [Point("fedavg", "cnn-fmnist", cnn_clients, rounds=rounds, conv=conv,
                     label=f"cnn-200-conv-{conv}") for conv in ("xla", "matmul")]
    points += [Point("fedavg", "mlp", scale(1000), rounds=rounds, clients_per_round=scale(100),
                     members=m, label=f"sweep-{m}-members") for m in members]
    points.append(Point("fesem", "mclr", 20 if tiny else 1_000_000, rounds=3,
                        clients_per_round=scale(1000), label="fesem-1m-clients", plan=True))
    for size in (None, *block_sizes):
        points.append(Point("fedavg", "mlp", scale(10_000), rounds=rounds,
                            clients_per_round=scale(1000), block_size=size,
                            label=f"block-{'rule' if size is None else size}"))
    return [dataclasses.replace(p, rows_per_client=rows) for p in points]


def table_settings(tiny: bool = False, data_dir: Optional[str] = None) -> dict[str, dict]:
    """The run settings (flat keys) of each table cell; `data_dir`: the folder of
    Fashion-MNIST's IDX files (default: Debian's)."""
    base = load_file(_setting_path())
    if data_dir is not None:
        base["data_dir"] = data_dir
    if tiny:  # the same algorithms at test size, without Fashion-MNIST
        base.update(dataset="synthetic", partition=None, model="mclr", clients=20,
                    clients_per_round=4, rounds=2, local_epochs=1, eval_every=1, clusters=2,
                    embed_clients=0)
    # each cell changes the setting's algorithm (FlexCFL's) as a table's cells do: K and the
    # score go to the clustered cells only
    cells = {name: from_dict(base).replace(algorithm=name).to_dict() for name in TABLE_CELLS}
    if tiny:  # FlexCFL's cold start needs pretrain_scale * K clients
        cells["flexcfl"]["pretrain_scale"] = 2
    return cells


def _setting_path() -> str:
    """The table's settings file: installed as mcfl.experiments, or in the source checkout
    mcfl is imported from (``PYTHONPATH=.`` on a machine where it is not installed)."""
    try:
        return str(importlib.resources.files("mcfl.experiments") / f"{TABLE_SETTING}.toml")
    except ModuleNotFoundError:
        return str(Path(__file__).resolve().parents[2] / "experiments" / f"{TABLE_SETTING}.toml")


def run_table_cell(name: str, settings: dict, out_dir: Path, timeout: Optional[float],
                   in_process: bool = False, compile_cache: bool = True) -> dict:
    """One cell: wall time and the run's best / final accuracy (its summary.json). In its own
    process (``mcfl run --config``, its settings written beside its folder; with
    --no-compile-cache unless `compile_cache`) unless `in_process` (``--tiny``: no timeout
    then)."""
    folder = out_dir / "table" / name
    start = time.perf_counter()
    error = None
    if in_process:
        try:
            run(from_dict(settings), out_dir=folder, overwrite=True)
        except McflError as failure:
            error = str(failure)
    else:
        config_file = atomic.write_json(out_dir / "table" / f"{name}.json", settings)
        command = [sys.executable, "-m", "mcfl", "run", "--config", str(config_file),
                   "--out", str(folder), "--overwrite",
                   *([] if compile_cache else ["--no-compile-cache"])]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                  env=child_env())
            error = (None if proc.returncode == 0
                     else failure_message(proc.returncode, proc.stderr))
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout:g} s"
    wall = time.perf_counter() - start
    record = {"kind": "table", "label": f"table-{name}", "algorithm": name,
              "wall_seconds": wall, "status": "ok" if error is None else "failed"}
    if error is not None:
        return {**record, "error": error}
    summary = json.loads((folder / "summary.json").read_text())
    keys = ("best_accuracy_micro", "final_accuracy_micro", "paper_best_accuracy_micro",
            "rounds_completed", "seconds_per_round", "compile_seconds", "device", "backend")
    return {**record, **{k: summary.get(k) for k in keys}}


def run_suite(out_dir: Path, tiny: bool = False, only: Sequence[str] = (),
              timeout: Optional[float] = None,
              report: Optional[Callable[[dict], None]] = None,
              data_dir: Optional[str] = None, compile_cache: bool = True) -> dict:
    """Every workload (or those whose labels start with one of `only`), one after another;
    out_dir/bench.json is rewritten after each, summary.md and bench.png at the end. At
    `tiny` sizes the workloads run in this process (a process each would spend most of the
    time importing JAX), so their memory figures are this process's. `compile_cache`:
    whether the children keep their programs in JAX's persistent cache."""
    out_dir = Path(out_dir)

    def wanted(label: str) -> bool:
        return not only or any(label.startswith(prefix) for prefix in only)

    document = {"suite": "accelerator", "tiny": tiny, "machine": machine_info(), "points": []}
    write_json(out_dir / "bench.json", document)

    def add(record: dict) -> None:
        document["points"].append(record)
        if document["machine"]["backend"] is None and record.get("backend"):
            document["machine"].update(backend=record["backend"], device=record.get("device"))
        write_json(out_dir / "bench.json", document)
        if report is not None:
            report(record)

    try:
        for point in accelerator_points(tiny):
            if wanted(point.label):
                add({"label": point.label, **(_in_process(point) if tiny
                                              else run_point(point, timeout, compile_cache))})
        for name, settings in table_settings(tiny, data_dir).items():
            if wanted(f"table-{name}"):
                add(run_table_cell(name, settings, out_dir, timeout, in_process=tiny,
                                   compile_cache=compile_cache))
    finally:
        plot_bench(out_dir / "bench.png", [p for p in document["points"]
                                           if p.get("kind") == "train"])
        atomic.write_text(out_dir / "summary.md", summary_markdown(document))
    return document


def _in_process(point: Point) -> dict:
    """`run_point`'s record, measured in this process."""
    try:
        return measure_point(point)
    except Exception as error:  # recorded, as a child's failure is
        return {**point_settings(point), "status": "failed",
                "error": f"{type(error).__name__}: {error}"}


def summary_markdown(document: dict) -> str:
    """The suite's table: each workload's round time beside `mcfl plan`'s bound."""
    machine = document["machine"]
    lines = [f"# mcfl bench --suite accelerator{' --tiny' if document['tiny'] else ''}", "",
             f"{machine.get('device')} ({machine.get('backend')}), jax "
             f"{machine.get('jax_version')}, {machine.get('date')}", "",
             "| workload | clients | a round | s / round | plan's bound (s) | measured / bound "
             "| peak device MB | note |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for p in document["points"]:
        if p["status"] != "ok":
            lines.append(f"| {p['label']} | | | | | | | FAILED: {p.get('error')} |")
            continue
        bound = p.get("plan_round_seconds")
        measured = p.get("seconds_per_round")
        ratio = f"{measured / bound:.1f}" if bound and measured else ""
        note = ""
        if p.get("kind") == "sweep":
            note = (f"{p['members']} members: {p['seconds_per_member_round']:.4f} s per "
                    "member-round")
        elif p.get("kind") == "table":
            note = (f"best {_num(p.get('best_accuracy_micro'))}, paper's rule "
                    f"{_num(p.get('paper_best_accuracy_micro'))}, final "
                    f"{_num(p.get('final_accuracy_micro'))}; {p.get('rounds_completed')} "
                    f"rounds, {p['wall_seconds']:.0f} s in all")
        elif p["label"].startswith("block"):
            note = f"block size {p.get('block_size')}"
        lines.append(
            f"| {p['label']} | {p.get('clients', '')} | {p.get('clients_per_round', '')} | "
            f"{_num(measured)} | {_num(bound)} | {ratio} | {_num(p.get('device_peak_mb'))} | "
            f"{note} |")
    return "\n".join(lines) + "\n"


def _num(x) -> str:
    return "" if x is None else f"{x:.4g}"
