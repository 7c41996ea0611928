"""XLA:CPU's fusion emitters on (JAX's default) and off (``XLA_FLAGS=
--xla_cpu_use_fusion_emitters=false``): compile time and round time of whole `mcfl run`s.

The test suite turns them off (tests/conftest.py), where compiling is most of the time. This
measures what the flag does to runs as users make them: fully optimised programs, JAX's
persistent compilation cache off (so every run compiles), each run in a fresh process.

    python benchmarks/fusion_emitters.py --repeats 2

Workloads: FedAvg and FeSEM on Synthetic(1,1) with MCLR (100 clients, 20 a round, E = 1), and
FedAvg with FlexCFL's FashionMNIST CNN (500 clients, 20 a round, E = 1; Debian's
dataset-fashion-mnist or --data-dir). Prints, per workload and flag, the median over the
repeats of the run's wall time, its compile seconds (the round and evaluation programs), its
init seconds and its steady seconds per round (summary.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

OFF = "--xla_cpu_use_fusion_emitters=false"
WORKLOADS = {
    "fedavg-mclr": ["--algorithm", "fedavg", "--dataset", "synthetic", "--rounds", "20"],
    "fesem-mclr": ["--algorithm", "fesem", "--dataset", "synthetic", "--rounds", "20",
                   "--clusters", "4"],
    "fedavg-cnn-fmnist": ["--algorithm", "fedavg", "--dataset", "fmnist", "--partition",
                          "ditto-fmnist", "--clients", "500", "--model", "cnn-fmnist",
                          "--rounds", "6", "--lr", "0.005"],
}
COMMON = ["--clients-per-round", "20", "--local-epochs", "1", "--batch-size", "10",
          "--eval-every", "5", "--embed-clients", "0", "--no-compile-cache", "--overwrite"]
FIELDS = ("wall_seconds", "compile_seconds", "init_seconds", "seconds_per_round")


def run(workload: str, flags: str, data_dir, out: Path) -> dict:
    command = [sys.executable, "-m", "mcfl", "run", *WORKLOADS[workload], *COMMON,
               "--out", str(out)]
    if data_dir and "fmnist" in WORKLOADS[workload]:
        command += ["--data-dir", data_dir]
    env = {**os.environ, "XLA_FLAGS": flags}
    env.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {field: summary[field] for field in FIELDS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--data-dir", help="Fashion-MNIST's IDX files (default: Debian's)")
    args = parser.parse_args()
    variants = {"on (default)": "", "off": OFF}
    results = {(w, v): [] for w in args.workloads for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):  # interleaved, so drift in the machine hits both
            for workload in args.workloads:
                for name, flags in variants.items():
                    results[workload, name].append(
                        run(workload, flags, args.data_dir, Path(tmp) / "run"))
    print("| workload | fusion emitters | wall s | compile s | init s | s / round |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (workload, name), runs in results.items():
        medians = [statistics.median(r[f] for r in runs) for f in FIELDS]
        print(f"| {workload} | {name} | {medians[0]:.2f} | {medians[1]:.2f} | "
              f"{medians[2]:.2f} | {medians[3]:.4f} |")


if __name__ == "__main__":
    main()
