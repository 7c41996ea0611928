"""Every algorithm on Fashion-MNIST with planted clusters: single-model baselines against
the clustered ones.

    python benchmarks/planted.py                 # both partitions, the table of BENCHMARKS.md
    python benchmarks/planted.py --seeds 0 1 2 3 # + how often each recovers the clusters
    python benchmarks/planted.py --model mlp     # MLP 784-200-10 (FeSEM-MA has units to match)
    python benchmarks/planted.py --algorithms local fesem robust --client-store-dtype bfloat16
                                                 # what bfloat16 storage of clients' state does

200 clients, every client every round, 30 rounds, E = 1, B = 10, lr = 0.05, K = 4 (CFL: at
most 4 clusters, eps1 = 0.4, eps2 = 0.9 after 5 rounds, set from the update norms of this
problem: about 1.1 per client). Needs Debian's dataset-fashion-mnist.
"""

from __future__ import annotations

import argparse
import time

import mcfl
from mcfl import load_dataset

ALGORITHMS = {
    "fedavg": {},
    "local": {},
    "feddist": {},
    "feddws": {},
    "feddane": {},
    "fesem": {},
    "fesem_ma": {},
    "ifca": {},
    "cfl": {"cfl_eps1": 0.4, "cfl_eps2": 0.9, "cfl_warmup": 5},
    "robust": {},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partitions", nargs="+", default=["rotated:4", "permuted:4"])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seeds", nargs="*", type=int, default=[])
    parser.add_argument("--model", choices=("mclr", "mlp"), default="mclr")
    parser.add_argument("--algorithms", nargs="+", choices=tuple(ALGORITHMS),
                        default=[name for name in ALGORITHMS if name != "local"])
    parser.add_argument("--client-store-dtype", choices=("float32", "bfloat16"),
                        default="float32")
    args = parser.parse_args()
    base = mcfl.RunConfig(dataset="fmnist", clients=200, rounds=args.rounds, embed_clients=0,
                          hidden=(200,),
                          clients_per_round=1.0, model=args.model, lr=0.05, local_epochs=1,
                          batch_size=10, clusters=4, eval_every=args.rounds, seed=0,
                          client_store_dtype=args.client_store_dtype)
    print("| partition | algorithm | micro acc | macro acc | ARI | NMI | clusters | s/round |"
          " wall |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for partition in args.partitions:
        config = base.replace(partition=partition)
        data = load_dataset(config)
        for name in args.algorithms:
            extra = ALGORITHMS[name]
            start = time.perf_counter()
            s = mcfl.run(config.replace(algorithm=name, **extra), dataset=data).summary
            ari, nmi = s.get("cluster_ari"), s.get("cluster_nmi")
            print(f"| {partition} | {name} | {s['final_accuracy_micro']:.3f} | "
                  f"{s['final_accuracy_macro']:.3f} | {'-' if ari is None else f'{ari:.2f}'} | "
                  f"{'-' if nmi is None else f'{nmi:.2f}'} | {s.get('num_clusters', 1):g} | "
                  f"{s['seconds_per_round']:.3f} | {time.perf_counter() - start:.1f} s |",
                  flush=True)
    if args.seeds:
        config = base.replace(partition=args.partitions[-1])
        data = load_dataset(config)
        for name in ("fesem", "ifca", "cfl"):
            aris = [mcfl.run(config.replace(algorithm=name, seed=seed, data_seed=0,
                                            **ALGORITHMS[name]), dataset=data)
                    .summary["cluster_ari"] for seed in args.seeds]
            print(f"{name} on {args.partitions[-1]}, seeds {args.seeds}: ARI "
                  f"{', '.join(f'{a:.2f}' for a in aris)}", flush=True)


if __name__ == "__main__":
    main()
