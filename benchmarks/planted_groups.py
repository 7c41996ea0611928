"""CFL and Robust on planted groups they were not tuned on: CFL's rule for clients absent when
their cluster splits (`--cfl-rejoin`), and how long Robust's clients train before its one-shot
clustering (`--robust-start-epochs`).

    python benchmarks/planted_groups.py cfl                # every rule, both participations
    python benchmarks/planted_groups.py cfl --rules descendants --participation 0.25 --seeds 0 1 2
    python benchmarks/planted_groups.py robust --start-epochs 1 5 20 --rounds 40

Fashion-MNIST (Debian's dataset-fashion-mnist), 240 clients drawing the 70,000 rows at random
(about 290 each), in 4 planted groups: rotations (``rotated``), label permutations
(``permuted``) or swapped label pairs (``label_swap``), of equal sizes or uneven ones (96 / 72
/ 48 / 24 clients), or all 240 in one group (``--groups one``: nothing to find). MCLR, lr 0.05,
E = 5, B = 10, 60 rounds (`--rounds`), K = 4; CFL and Robust with their defaults otherwise
(CFL: relative thresholds eps1 0.4, eps2 0.5, halves split only when their updates apart,
20 warm-up rounds, at most K = `--clusters` clusters). Prints one Markdown row a run: final ARI
against the planted groups, clusters, micro accuracy, and the clients in a cluster holding more
than one planted group.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import mcfl
from mcfl.algorithms.clustered.cfl import REJOIN
from mcfl.data.loaders import load_fmnist
from mcfl.data.partition import plant_rows

GROUP_SIZES = {"equal": (60, 60, 60, 60), "uneven": (96, 72, 48, 24), "one": (240,)}


def planted(kind: str, sizes: tuple[int, ...], seed: int = 0):
    """The clients of GROUP_SIZES `sizes`, their rows transformed by their group (`kind`)."""
    source = load_fmnist()
    rng = np.random.default_rng(seed)
    clients = sum(sizes)
    cluster = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    owner = rng.permutation(np.arange(len(source.y)) % clients)
    x, y = plant_rows(kind, source.x.astype(np.float32) / 255.0, source.y, cluster[owner],
                      len(sizes), 10, rng)
    return mcfl.data.from_arrays(x.reshape(len(x), -1), y, owner, num_classes=10,
                                 test_fraction=0.2, seed=seed, true_cluster=cluster)


def mixed_clients(assignment: np.ndarray, truth: np.ndarray) -> int:
    """Clients whose cluster holds clients of more than one planted group."""
    mixed = [c for c in np.unique(assignment) if len(np.unique(truth[assignment == c])) > 1]
    return int(np.isin(assignment, mixed).sum())


def row(kind: str, groups: str, share: float, setting: str, seed: int, result, data,
        seconds: float) -> str:
    s = result.summary
    assignment = np.asarray(result.assignments[-1])
    return (f"| {kind} | {groups} | {share:g} | {setting} | {seed} | {s['cluster_ari']:.3f} | "
            f"{s['num_clusters']:g} | {s['final_accuracy_micro']:.3f} | "
            f"{mixed_clients(assignment, data.true_cluster)} | {seconds:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("algorithm", choices=("cfl", "robust"))
    parser.add_argument("--kinds", nargs="+", default=["rotated", "permuted", "label_swap"])
    parser.add_argument("--groups", nargs="+", choices=tuple(GROUP_SIZES),
                        default=["equal", "uneven"])
    parser.add_argument("--rules", nargs="+", choices=REJOIN, default=list(REJOIN),
                        help="cfl: the --cfl-rejoin rules compared")
    parser.add_argument("--start-epochs", nargs="+", type=int, default=[0, 1, 20],
                        help="robust: the --robust-start-epochs compared (0: the run's E)")
    parser.add_argument("--participation", nargs="+", type=float, default=[1.0, 0.25])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--clusters", type=int, default=4, help="K (CFL: at most K clusters)")
    parser.add_argument("--separation", type=float, default=None,
                        help="cfl: --cfl-separation (default: mcfl's; -2: none)")
    args = parser.parse_args()
    settings = ([{"cfl_rejoin": rule} for rule in args.rules] if args.algorithm == "cfl"
                else [{"robust_start_epochs": e} for e in args.start_epochs])
    if args.algorithm == "cfl" and args.separation is not None:
        for setting in settings:
            setting["cfl_separation"] = args.separation
    print(f"| data | groups | clients a round | {args.algorithm} setting | seed | ARI | "
          "clusters | micro acc | clients in mixed clusters | s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind in args.kinds:
        for groups in args.groups:
            data = planted(kind, GROUP_SIZES[groups])
            for share in args.participation:
                for setting in settings:
                    for seed in args.seeds:
                        config = mcfl.RunConfig(
                            algorithm=args.algorithm, model="mclr", lr=0.05, local_epochs=5,
                            batch_size=10, clusters=args.clusters, rounds=args.rounds,
                            eval_every=args.rounds, clients_per_round=share, embed_clients=0,
                            clients=data.num_clients, seed=seed, **setting)
                        start = time.perf_counter()
                        result = mcfl.run(config, dataset=data)
                        print(row(kind, groups, share, ", ".join(map(str, setting.values())), seed,
                                  result, data, time.perf_counter() - start), flush=True)


if __name__ == "__main__":
    main()
