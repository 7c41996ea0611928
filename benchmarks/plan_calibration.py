"""`mcfl plan`'s lower bound on a round beside the measured round, on this machine's CPU.

    .venv/bin/python benchmarks/plan_calibration.py --out runs/plan-calibration

Three workloads, each a `mcfl bench` point in its own process (planted Gaussian data, 50 rows
per client, B = 10, one local epoch, 5 rounds; s/round is the median of rounds 2-5), with
`mcfl plan`'s roofline bound for `cpu-here` (this CPU's matmul rate and copy bandwidth,
measured in the same process) computed on the same config:
- FedAvg, MLP 784-200-200-10, 1,000 clients, all of them every round (full participation);
- FedAvg, the FashionMNIST CNN (FlexCFL's), 200 clients, 20 a round;
- FeSEM (K = 4), MCLR, 100,000 clients, 100 a round.
Writes OUT/bench.json and prints measured, bound and their ratio.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcfl.apps.bench import run_sweep  # noqa: E402
from mcfl.apps.bench_point import Point  # noqa: E402

WORKLOADS = (
    Point("fedavg", "mlp", 1000, rounds=5, label="fedavg-mlp-full", plan=True),
    Point("fedavg", "cnn-fmnist", 200, rounds=5, clients_per_round=20, label="fedavg-cnn-20",
          plan=True),
    Point("fesem", "mclr", 100_000, rounds=5, clients_per_round=100, label="fesem-100k",
          plan=True),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/plan-calibration")
    args = parser.parse_args()
    document = run_sweep(WORKLOADS, Path(args.out), timeout=1800)
    print(f"{'workload':<18} {'s/round':>9} {'bound (s)':>10} {'ratio':>6}  bound by")
    for p in document["points"]:
        if p["status"] != "ok":
            print(f"{p['label']:<18} FAILED: {p['error']}")
            continue
        ratio = p["seconds_per_round"] / p["plan_round_seconds"]
        print(f"{p['label']:<18} {p['seconds_per_round']:>9.4f} {p['plan_round_seconds']:>10.5f} "
              f"{ratio:>6.1f}  {p['plan_bound_by']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
