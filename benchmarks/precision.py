"""`--precision bfloat16` against float32: round time and the planted-clusters table.

    python benchmarks/precision.py timing              # FedAvg MLP and FashionMNIST CNN rounds
    python benchmarks/precision.py planted --seeds 0 1 2   # FeSEM and IFCA, planted clusters

timing: Fashion-MNIST (Debian's dataset-fashion-mnist), FedAvg, 20 clients a round, E = 1,
B = 10, lr 0.05: the MLP 784-200-200-10 on 100 clients (about 560 training rows, 56 steps
each) and FlexCFL's CNN (`cnn-fmnist`) on 500 clients (about 112 rows, 12 steps each); each
model in float32 as run by default (the factored fast paths where `--low-rank auto` takes
them: "factored" in the table), float32 on the per-client path (``--low-rank off``: the
path bfloat16 runs on, the factored ones computing in float32), and bfloat16; 5 rounds a run,
3 runs of each, interleaved. One row per variant: the least and the median over its runs of
the mean of rounds 2-5, and round 1 of its first run (compiled before it).

planted: `benchmarks/planted.py`'s table (200 clients, every client every round, 30 rounds,
MCLR, E = 1, B = 10, lr 0.05, K = 4) for FeSEM and IFCA on `rotated:4` and `permuted:4`,
float32 and bfloat16, one row per seed of the algorithm (the data fixed) and the mean.
"""

from __future__ import annotations

import argparse

import numpy as np

import mcfl
from mcfl import load_dataset

TIMING = {
    "mlp": dict(model="mlp", hidden=(200, 200), clients=100),
    "cnn-fmnist": dict(model="cnn-fmnist", clients=500),
}
VARIANTS = {
    "float32 (default: fast paths)": dict(precision="float32"),
    "float32, --low-rank off": dict(precision="float32", low_rank="off"),
    "bfloat16": dict(precision="bfloat16"),
}


def timing(args) -> None:
    """Each variant `--repeats` times, the variants interleaved (a run per variant in turn), so
    that load from elsewhere on a shared machine falls on all of them; the least mean shows
    each one's speed, the median how much it varied."""
    print("| model | precision | path | s/round, least of runs | median | round 1 | "
          "final micro acc |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models:
        base = mcfl.RunConfig(dataset="fmnist", algorithm="fedavg", clients_per_round=20,
                              rounds=args.rounds, eval_every=args.rounds, lr=0.05,
                              local_epochs=1, batch_size=10, seed=0, **TIMING[name])
        data = load_dataset(base)
        runs = {label: [] for label in VARIANTS}
        for _ in range(args.repeats):
            for label, changes in VARIANTS.items():
                runs[label].append(mcfl.run(base.replace(**changes), dataset=data).summary)
        for label, summaries in runs.items():
            times = [s["seconds_per_round"] for s in summaries]
            s = summaries[0]
            path = "factored" if s["low_rank"] else "per client"
            print(f"| {name} | {label} | {path} | {min(times):.3f} | {np.median(times):.3f} | "
                  f"{s['first_round_seconds']:.3f} | {s['final_accuracy_micro']:.3f} |",
                  flush=True)


def planted(args) -> None:
    base = mcfl.RunConfig(dataset="fmnist", clients=200, rounds=30, embed_clients=0,
                          clients_per_round=1.0, model="mclr", lr=0.05, local_epochs=1,
                          batch_size=10, clusters=4, eval_every=30, data_seed=0)
    print("| partition | algorithm | precision | micro acc per seed | mean | ARI per seed | "
          "s/round |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for partition in args.partitions:
        config = base.replace(partition=partition)
        data = load_dataset(config)
        for algorithm in ("fesem", "ifca"):
            for precision in ("float32", "bfloat16"):
                runs = [mcfl.run(config.replace(algorithm=algorithm, precision=precision,
                                                seed=seed), dataset=data).summary
                        for seed in args.seeds]
                acc = [s["final_accuracy_micro"] for s in runs]
                ari = [s["cluster_ari"] for s in runs]
                print(f"| {partition} | {algorithm} | {precision} | "
                      f"{', '.join(f'{a:.3f}' for a in acc)} | {np.mean(acc):.4f} | "
                      f"{', '.join(f'{a:.2f}' for a in ari)} | "
                      f"{np.mean([s['seconds_per_round'] for s in runs]):.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="part", required=True)
    t = sub.add_parser("timing")
    t.add_argument("--models", nargs="+", choices=tuple(TIMING), default=list(TIMING))
    t.add_argument("--rounds", type=int, default=5)
    t.add_argument("--repeats", type=int, default=3)
    p = sub.add_parser("planted")
    p.add_argument("--partitions", nargs="+", default=["rotated:4", "permuted:4"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    args = parser.parse_args()
    if args.part == "timing":
        timing(args)
    else:
        planted(args)


if __name__ == "__main__":
    main()
