"""FlexCFL against FedGroup under client-level distribution shift (FlexCFL Table IV setup).

    python benchmarks/shift.py              # 100 rounds
    python benchmarks/shift.py --rounds 300 # FlexCFL's length

Fashion-MNIST with 4 planted label permutations over 200 clients, 20 clients a round, K = 4,
alpha = 5 (20 cold-start clients), MCLR, E = 1, B = 10, lr = 0.05; with no shift
and with swap-all at p = 0.05. ARI is measured against the cluster of the data each client holds
at the end (a swap moves a client's planted cluster with its data).
"""

from __future__ import annotations

import time

import numpy as np
from sklearn.metrics import adjusted_rand_score

import mcfl
from mcfl import load_dataset


def current_ari(result, dataset, algorithm_view):
    shifted = algorithm_view
    original_owner = np.asarray(dataset.arrays.train_owner)
    first = np.asarray(shifted.train_order)[np.asarray(shifted.train_offsets)]
    truth = dataset.true_cluster[original_owner[first]]
    return adjusted_rand_score(truth, result.assignments[-1])


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    base = mcfl.RunConfig(algorithm="fedgroup", dataset="fmnist", partition="permuted:4",
                          clients=200, rounds=args.rounds,
                          clients_per_round=20, clusters=4, pretrain_scale=5, model="mclr",
                          lr=0.05, local_epochs=1, eval_every=10, seed=0)
    dataset = load_dataset(base)
    from mcfl.algorithms import build_algorithm
    from mcfl.models import make_model

    print("| shift | algorithm | final micro acc | best micro acc | ARI (current data) |"
          " migrated | wall |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for shift in ("none", "swap_all"):
        for name in ("fedgroup", "flexcfl"):
            config = base.replace(algorithm=name, shift=shift)
            start = time.perf_counter()
            result = mcfl.run(config, dataset=dataset)
            model = make_model("mclr", dataset.feature_shape, 10)
            algorithm = build_algorithm(config, model, 20)
            shifted = algorithm.client_models(result.state, dataset.arrays).data
            shifted = dataset.arrays if shifted is None else shifted
            s = result.summary
            migrated = sum(r.get("migrated_clients", 0) for r in result.rounds)
            print(f"| {shift} | {name} | {s['final_accuracy_micro']:.3f} | "
                  f"{s['best_accuracy_micro']:.3f} | {current_ari(result, dataset, shifted):.2f} |"
                  f" {migrated:g} | {time.perf_counter() - start:.0f} s |", flush=True)


if __name__ == "__main__":
    main()
