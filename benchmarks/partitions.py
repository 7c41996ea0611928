"""Time the partitioners on Fashion-MNIST's 70,000 labels (Debian's dataset-fashion-mnist).

    python benchmarks/partitions.py            # 10,000 clients
    python benchmarks/partitions.py --clients 1000

Prints one line per partition: seconds (best of --repeat), rows used, clients' min/median/max.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mcfl.data import partition
from mcfl.data.loaders import load_fmnist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    labels = load_fmnist().y
    cases = {
        "iid": lambda rng: partition.iid(labels.size, args.clients, rng),
        "dirichlet:0.05": lambda rng: partition.dirichlet(labels, args.clients, 0.05, rng),
        "dirichlet:0.5": lambda rng: partition.dirichlet(labels, args.clients, 0.5, rng),
        "shards:2": lambda rng: partition.shards(labels, args.clients, 2, 10, rng),
        "ditto-fmnist": lambda rng: partition.ditto_fmnist(labels, args.clients, 10, rng),
    }
    print(f"{labels.size:,} labels, {args.clients:,} clients")
    for name, make in cases.items():
        times = []
        for r in range(args.repeat):
            start = time.perf_counter()
            owner = make(np.random.default_rng(r))
            times.append(time.perf_counter() - start)
        sizes = np.bincount(owner[owner >= 0], minlength=args.clients)
        print(f"{name:<16} {min(times):8.3f} s   rows used {int((owner >= 0).sum()):>6,}   "
              f"per client min {sizes.min()} median {np.median(sizes):g} max {sizes.max()}")


if __name__ == "__main__":
    main()
