"""Run by tests/test_multihost.py: FedAvg and FeSEM rounds in one process of a run over
`--num-processes` processes (or alone with `--num-processes 1`), printing JSON from process 0:
per run the round losses, the final accuracy and the first values of every model leaf."""

from __future__ import annotations

import argparse
import json
import sys

import jax
import numpy as np

import mcfl
from mcfl.runtime import distributed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator")
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    args = parser.parse_args()
    if args.num_processes > 1:
        distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    out = {"devices": len(jax.devices()), "processes": jax.process_count()}
    for algorithm in ("fedavg", "fesem"):
        extra = {"fesem_restarts": 2, "clusters": 3} if algorithm == "fesem" else {}
        config = mcfl.RunConfig(algorithm=algorithm, dataset="synthetic", clients=24, rounds=3,
                                model="mlp", hidden=(16,), local_steps=3, clients_per_round=8,
                                block_size=2, **extra)
        result = mcfl.run(config)
        models = result.state.models if algorithm == "fesem" else result.state.params
        out[algorithm] = {
            "losses": [row["train_loss"] for row in result.rounds],
            "accuracy": result.summary["final_accuracy_micro"],
            "leaves": [np.asarray(x, np.float64).ravel()[:100].tolist()
                       for x in jax.tree.leaves(models)],
            "devices": result.summary["devices"],
        }
    if distributed.is_leader():
        json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
