"""The accelerator's path choices, timed with each forced on and off, in one process a workload.

    python benchmarks/device_check.py cnn --out DIR      # FMNIST CNN, 200 clients
    python benchmarks/device_check.py mlp --out DIR      # MLP 784-200-200-10
    python benchmarks/device_check.py fesem --out DIR    # FeSEM, 100,000 MCLR clients
    python benchmarks/device_check.py cnn --tiny --out DIR   # the same variants, CPU-test sized

`benchmarks/device_check.sh` runs all three beside a PyTorch per-client loop and two table
cells; this file is its part that times mcfl's automatic choices (`--fast-paths`, `--low-rank`,
`--conv`, the block size, `--scan-rounds`) against each forced value. A workload's dataset is
built once (`mcfl bench`'s planted Gaussian data, every client the same rows, so every round
does the same work) and each variant is one `mcfl.run` on it: its compilation is timed apart
(the run compiles before round 1), and its round time is the median of the rounds after the
first. DIR/WORKLOAD.json is rewritten after every variant, so a stop keeps what was measured.
The device's peak memory is the process's (cumulative over the variants run so far).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jax

from mcfl.apps.bench import machine_info
from mcfl.apps.bench_data import benchmark_dataset
from mcfl.apps.bench_point import FEATURES, Point, training_config
from mcfl.runs.runner import run


@dataclasses.dataclass(frozen=True)
class Workload:
    """One dataset and the run settings shared by its variants."""

    name: str
    point: Point  # the dataset's size and the run's base settings
    variants: dict[str, dict]  # label -> RunConfig fields forced for that variant


def workloads(tiny: bool) -> dict[str, list[Workload]]:
    """Each section's workloads. The first variant of each is the automatic choice."""
    def clients(n: int) -> int:
        return max(8, n // 500) if tiny else n

    rounds = 3 if tiny else 5
    choices = {"auto": {}, "fast-paths-off": {"fast_paths": "off"},
               "low-rank-on": {"low_rank": "on"}, "low-rank-off": {"low_rank": "off"}}
    cnn_rows = 10 if tiny else 50
    cnn = Point("fedavg", "cnn-fmnist", clients(200), rounds=rounds, rows_per_client=cnn_rows)
    mlp_many = Point("fedavg", "mlp", clients(10_000), rounds=rounds,
                     clients_per_round=clients(1_000))
    mlp_all = Point("fedavg", "mlp", clients(1_000), rounds=rounds)
    fesem = Point("fesem", "mclr", clients(100_000), rounds=6 if tiny else 20,
                  clients_per_round=clients(100))
    blocks = (2, 4) if tiny else (128, 512, 2048)
    return {
        "cnn": [
            Workload("cnn-all", cnn, {**choices, "conv-xla": {"conv": "xla"},
                                      "block-50": {"block_size": clients(50)},
                                      "block-200": {"block_size": clients(200)}}),
            Workload("cnn-20", dataclasses.replace(cnn, clients_per_round=clients(20)),
                     {k: choices[k] for k in ("auto", "fast-paths-off", "low-rank-off")}),
        ],
        "mlp": [
            Workload("mlp-1000-of-10000", mlp_many,
                     {**choices, **{f"block-{b}": {"block_size": b} for b in blocks}}),
            Workload("mlp-all", mlp_all, choices),
        ],
        "fesem": [Workload("fesem-100", fesem, {"auto": {}, "scan-rounds-on": {"scan_rounds": "on"},
                                                "scan-rounds-off": {"scan_rounds": "off"}})],
    }


def time_variant(config, dataset) -> dict:
    """One run of `config` on `dataset`: its compile time and steady round time."""
    start = time.perf_counter()
    result = run(config, dataset=dataset)
    wall = time.perf_counter() - start
    summary = result.summary
    seconds = [row["seconds"] for row in result.rounds]
    steady = seconds[1:] or seconds
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return {
        "status": "ok",
        "seconds_per_round": statistics.median(steady),
        "seconds_per_round_min": min(steady),
        "first_round_seconds": seconds[0],
        "round_seconds": seconds,
        "compile_seconds": summary["compile_seconds"],
        "init_seconds": summary["init_seconds"],
        "wall_seconds": wall,
        "block_size": summary["block_size"],
        "low_rank": summary.get("low_rank"),
        "clients_per_round": summary["clients_per_round"],
        "final_accuracy_micro": summary["final_accuracy_micro"],
        "process_device_peak_mb": None if peak is None else peak / 2**20,
    }


def run_section(name: str, tiny: bool, out_file: Path, only: tuple[str, ...] = (),
                workload_names: tuple[str, ...] = ()) -> dict:
    """Every variant of section `name`'s workloads (those of `workload_names`, the variants
    labelled in `only`, where given); `out_file` rewritten after each."""
    document = {"section": name, "tiny": tiny, "machine": machine_info(),
                "backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
                "jax_version": jax.__version__, "variants": []}

    def write() -> None:
        tmp = out_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(document, indent=1, default=str) + "\n")
        os.replace(tmp, out_file)

    write()
    for work in workloads(tiny)[name]:
        if workload_names and work.name not in workload_names:
            continue
        point = work.point
        base = training_config(point)
        start = time.perf_counter()
        dataset = benchmark_dataset(point.clients, FEATURES[point.model], point.rows_per_client,
                                    seed=point.seed)
        data_seconds = time.perf_counter() - start
        for label, forced in work.variants.items():
            if only and label not in only:
                continue
            record = {"workload": f"{point.algorithm}-{point.model}-{point.clients}",
                      "clients": point.clients, "clients_per_round": base.clients_per_round,
                      "label": label, "forced": forced, "data_seconds": data_seconds}
            try:
                record.update(time_variant(base.replace(**forced), dataset))
            except Exception as error:  # recorded; the other variants still run
                record.update(status="failed", error=f"{type(error).__name__}: {error}"[:2000])
            document["variants"].append(record)
            write()
            print(_line(record), flush=True)
        del dataset
    return document


def _line(record: dict) -> str:
    if record["status"] != "ok":
        return f"{record['workload']} x{record['clients_per_round']} {record['label']}: FAILED " \
               f"{record['error'][:300]}"
    return (f"{record['workload']} x{record['clients_per_round']} {record['label']}: "
            f"{record['seconds_per_round']:.4f} s/round (min {record['seconds_per_round_min']:.4f}"
            f", first {record['first_round_seconds']:.3f}), compile "
            f"{record['compile_seconds']:.1f} s, block {record['block_size']}, low_rank "
            f"{record['low_rank']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=("cnn", "mlp", "fesem"))
    parser.add_argument("--out", type=Path, required=True, help="folder for SECTION.json")
    parser.add_argument("--tiny", action="store_true", help="CPU-test sizes")
    parser.add_argument("--only", nargs="*", default=(), help="variant labels to run")
    parser.add_argument("--workloads", nargs="*", default=(), help="workload names to run")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    document = run_section(args.section, args.tiny, args.out / f"{args.section}.json",
                           tuple(args.only), tuple(args.workloads))
    return 0 if all(v["status"] == "ok" for v in document["variants"]) else 1


if __name__ == "__main__":
    sys.exit(main())
