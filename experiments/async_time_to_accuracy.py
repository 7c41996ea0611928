"""Time to a target accuracy, in simulated seconds, of synchronous FedAvg (plain, with
over-selection, with a deadline) against FedBuff and FedAsync, under heavy-tailed device
speeds (REPRODUCTION.md, "Unreliable and asynchronous clients").

    python experiments/async_time_to_accuracy.py OUT [--seeds 0,1,2] [--datasets fmnist,synthetic]

Every method sees the same clients, the same devices (speeds lognormal:0,1 local steps per
simulated second, drawn from the run's seed) and the same number of client updates
(``UPDATES``): FedAvg 10 clients a round, FedBuff's server step K = 10 arrivals of C = 20 in
flight, FedAsync one arrival a step of C = 10 in flight. Each run is a folder of OUT (a run
already complete there is read, not run again: stopping and starting again loses nothing
finished); the table goes to OUT/table.md and OUT/table.json, each written atomically.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

import mcfl

UPDATES = 400  # client updates per run: 40 rounds of 10
DATASETS = {  # dataset -> (its settings, the target accuracy)
    "fmnist": (dict(dataset="fmnist", clients=100, model="mclr", lr=0.05), 0.75),
    "synthetic": (dict(dataset="synthetic", clients=100, model="mclr", lr=0.05), 0.45),
}
COMMON = dict(local_steps=10, batch_size=10, embed_clients=0, device_speeds="lognormal:0,1")
METHODS = {  # label -> settings
    "FedAvg": dict(algorithm="fedavg", clients_per_round=10, rounds=UPDATES // 10),
    "FedAvg, over-selection 30%": dict(algorithm="fedavg", clients_per_round=10,
                                       over_select=0.3, rounds=UPDATES // 10),
    "FedAvg, deadline 15 s (partial work)": dict(algorithm="fedavg", clients_per_round=10,
                                                 deadline=15.0, rounds=UPDATES // 10),
    "FedBuff (C = 20, K = 10)": dict(algorithm="fedbuff", concurrency=20, buffer_size=10,
                                     rounds=UPDATES // 10),
    "FedAsync (C = 10, alpha = 0.6)": dict(algorithm="fedasync", concurrency=10,
                                           async_alpha=0.6, rounds=UPDATES, eval_every=10),
}


def run_folder(out: Path, dataset: str, method: str, seed: int) -> Path:
    slug = "".join(c if c.isalnum() else "_" for c in method).strip("_").lower()
    return out / dataset / f"{slug}_seed{seed}"


def rounds_of(config: mcfl.RunConfig, folder: Path) -> list[dict]:
    """The run's rows: read back when the folder holds a finished run, else run it."""
    summary = folder / "summary.json"
    if summary.is_file() and json.loads(summary.read_text()).get("status") == "finished":
        import csv
        with open(folder / "rounds.csv") as f:
            return [{k: float(v) for k, v in row.items() if v not in ("", None)}
                    for row in csv.DictReader(f)]
    return mcfl.run(config, out_dir=folder, overwrite=True).rounds


def time_to(rows: list[dict], target: float) -> float:
    """The simulated seconds at the first evaluated round at or above `target` (inf: never)."""
    for row in rows:
        if row.get("accuracy_micro", -1) >= target:
            return row["sim_time"]
    return math.inf


def _shown(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < len(values):
        return f"not reached in {len(values) - len(finite)} of {len(values)} seeds" + (
            f" (others {statistics.mean(finite):,.0f})" if finite else "")
    spread = statistics.stdev(finite) if len(finite) > 1 else 0.0
    return f"{statistics.mean(finite):,.0f} ± {spread:,.0f}"


def write_atomically(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict = {}
    lines = ["| dataset (target) | method | simulated s to target (mean ± sd) | final accuracy "
             "| simulated s for all updates |", "| --- | --- | --- | --- | --- |"]
    for dataset in args.datasets.split(","):
        settings, target = DATASETS[dataset]
        for method, own in METHODS.items():
            times, finals, spans = [], [], []
            for seed in seeds:
                config = mcfl.RunConfig(**settings, **COMMON, **own, seed=seed)
                rows = rounds_of(config, run_folder(out, dataset, method, seed))
                times.append(time_to(rows, target))
                finals.append([r for r in rows if "accuracy_micro" in r][-1]["accuracy_micro"])
                spans.append(rows[-1]["sim_time"])
                print(f"{dataset} {method} seed {seed}: {times[-1]:.0f} s to {target}",
                      flush=True)
            results.setdefault(dataset, {})[method] = {
                "target": target, "seconds_to_target": times, "final_accuracy": finals,
                "sim_seconds": spans}
            lines.append(f"| {dataset} ({target}) | {method} | {_shown(times)} | "
                         f"{statistics.mean(finals):.3f} ± {statistics.pstdev(finals):.3f} | "
                         f"{statistics.mean(spans):,.0f} |")
    write_atomically(out / "table.json", json.dumps(results, indent=1))
    write_atomically(out / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
