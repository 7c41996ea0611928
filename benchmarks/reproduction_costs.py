"""The costs found while reproducing FlexCFL's FashionMNIST-CNN table (issue 15), measured on
that table's own data (500 Ditto-recipe clients, the 3.27 M-parameter CNN):

    python benchmarks/reproduction_costs.py chunks 256 64 32 16   # IFCA's per-round losses
    python benchmarks/reproduction_costs.py fesem-memory           # FeSEM's start, XLA's plan

`chunks`: seconds for `ifca.losses_of_models` (IFCA's identity estimate: 20 sampled clients x
5 models, forward only) with each row-chunk size, median of 3 after a first (compiling) call.
`fesem-memory`: the argument, output and temporary bytes XLA plans for FeSEM's initialisation
(every client trains once, then k-means with 20 restarts on their models), compiled only.
Needs Fashion-MNIST (Debian's dataset-fashion-mnist).
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from mcfl import load_dataset
from mcfl.algorithms import build_algorithm, hyperparams
from mcfl.algorithms.clustered import ifca
from mcfl.config import from_dict, load_file
from mcfl.engine.sampling import sample_clients
from mcfl.runs.execution import plan_run

CONFIG = "experiments/flexcfl_table3_fmnist.toml"


def setting(algorithm: str):
    config = from_dict({**load_file(CONFIG), "algorithm": algorithm, "local_epochs": 2})
    dataset = load_dataset(config)
    return config, dataset, plan_run(config, dataset)


def chunks(sizes: list[int]) -> None:
    _, dataset, plan = setting("ifca")
    data = dataset.arrays
    models = jax.vmap(plan.model.init)(jax.random.split(jax.random.key(0), 5))
    counts = np.asarray(data.train_counts)
    print(f"training rows per client: mean {counts.mean():.1f}, median {np.median(counts)}, "
          f"max {counts.max()}")
    for chunk in sizes:
        fn = jax.jit(lambda m, d, c, chunk=chunk: ifca.losses_of_models(
            plan.model.apply, d, m, c, chunk, block_size=plan.block_size))
        times = []
        for r in range(4):
            clients = sample_clients(jax.random.key(r), data.num_clients, 20)
            t0 = time.perf_counter()
            fn(models, data, clients).block_until_ready()
            times.append(time.perf_counter() - t0)
        print(f"chunk {chunk:4d}: first call {times[0]:.2f} s, then {np.median(times[1:]):.3f} s "
              "(20 clients x 5 models)", flush=True)


def fesem_memory() -> None:
    config, dataset, plan = setting("fesem")
    algorithm = build_algorithm(config, plan.model, plan.clients_per_round, plan.block_size)
    hp = hyperparams(config, plan.model)
    compiled = jax.jit(lambda d, k: algorithm.init(d, k, hp)).lower(
        dataset.arrays, jax.random.key(0)).compile()
    m = compiled.memory_analysis()
    print(f"FeSEM start, {dataset.num_clients} clients x {plan.params_count:,} parameters: "
          f"arguments {m.argument_size_in_bytes / 2**30:.2f} GB, outputs "
          f"{m.output_size_in_bytes / 2**30:.2f} GB, temporaries "
          f"{m.temp_size_in_bytes / 2**30:.2f} GB")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("chunks", "fesem-memory"))
    parser.add_argument("sizes", nargs="*", type=int, default=[256, 64, 32, 16])
    args = parser.parse_args()
    chunks(args.sizes) if args.what == "chunks" else fesem_memory()


if __name__ == "__main__":
    main()
