"""IFCA's start: K random models (the paper's) against k-means++ over one round of sampled
clients' local models, cluster recovery (ARI) and accuracy over seeds.

    .venv/bin/python benchmarks/ifca_init.py --seeds 8        # about 6 minutes on 2 cores

Fashion-MNIST (Debian's dataset-fashion-mnist), 200 clients IID with 4 planted clusters
(rotations or label permutations), every client every round, 30 rounds, MCLR, E = 1, B = 10,
lr 0.05, K = 4: the setting of BENCHMARKS.md's planted-cluster table, where random starts
merged two clusters on 2 seeds of 4.
"""

from __future__ import annotations

import argparse
import statistics

import mcfl
from mcfl import load_dataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--partitions", nargs="+", default=["rotated:4", "permuted:4"])
    args = parser.parse_args()
    print("| partition | start | ARI per seed | mean ARI | ARI = 1 | mean micro acc |")
    print("| --- | --- | --- | --- | --- | --- |")
    for partition in args.partitions:
        base = mcfl.RunConfig(algorithm="ifca", dataset="fmnist", partition=partition,
                              clients=200, rounds=args.rounds, clients_per_round=1.0,
                              model="mclr", lr=0.05, clusters=4, eval_every=args.rounds,
                              data_seed=0, embed_clients=0)
        data = load_dataset(base)
        for start in ("random", "kmeans++"):
            aris, accs = [], []
            for seed in range(args.seeds):
                s = mcfl.run(base.replace(seed=seed, ifca_init=start), dataset=data).summary
                aris.append(s["cluster_ari"])
                accs.append(s["final_accuracy_micro"])
            shown = ", ".join(f"{a:.2f}" for a in aris)
            print(f"| {partition} | {start} | {shown} | {statistics.fmean(aris):.3f} | "
                  f"{sum(a > 0.999 for a in aris)}/{len(aris)} | {statistics.fmean(accs):.3f} |",
                  flush=True)


if __name__ == "__main__":
    main()
