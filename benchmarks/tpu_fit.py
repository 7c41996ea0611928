"""The largest client counts of mcfl's headline workloads that fit each Colab TPU, from the TPU
compiler itself (`mcfl.planning.tpu_compile`, the ``tpu-aot`` extra), on a CPU-only machine.

Workloads are `mcfl bench --suite accelerator`'s points (`mcfl.apps.bench_point.
training_config`: 50 training and 10 test rows a client, one epoch of B = 10 a round):

* ``fesem-mclr``: FeSEM (K = 4) with MCLR on 60 features, 1,000 clients a round (the
  suite's ``fesem-1m-clients``);
* ``fedavg-cnn``: FedAvg with the FashionMNIST CNN on 28 x 28 images, 20 clients a round
  (``cnn-20-a-round``).

For each target the compiler is asked at two client counts, and then 1% either side of where
the line through their needs meets the HBM it offers (`largest_fit`): a bracket within 2%.
The client rows are shapes only: the programs are compiled, nothing is computed, so a million
clients' data need no memory here.

    python benchmarks/tpu_fit.py --out benchmarks/results/tpu-fit.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Optional

import jax
import numpy as np

from mcfl.apps.bench_data import benchmark_dataset
from mcfl.apps.bench_point import FEATURES, Point, training_config
from mcfl.files.atomic import write_json
from mcfl.planning import tpu_compile
from mcfl.planning.estimate import client_loop_trips

WORKLOADS = {
    "fesem-mclr": Point("fesem", "mclr", 0, rounds=3, clients_per_round=1000),
    "fedavg-cnn": Point("fedavg", "cnn-fmnist", 0, rounds=3, clients_per_round=20),
}
TARGETS = ("tpu-v2-8", "tpu-v5e-1", "tpu-v6e-1")


def shaped_dataset(point: Point, clients: int):
    """`mcfl bench`'s dataset of `clients` clients with its features as shapes only: the
    counts, owners and labels are real (the plan reads them), the rows are
    `jax.ShapeDtypeStruct`s of the real sizes."""
    small = benchmark_dataset(clients, 1, point.rows_per_client)
    features = FEATURES[point.model]
    arrays = small.arrays.replace(
        x_train=jax.ShapeDtypeStruct((small.arrays.x_train.shape[0], features), np.float32),
        x_test=jax.ShapeDtypeStruct((small.arrays.x_test.shape[0], features), np.float32))
    return dataclasses.replace(small, arrays=arrays, feature_shape=(features,))


def compiled(point: Point, clients: int, target: str) -> dict:
    config = training_config(dataclasses.replace(point, clients=clients))
    dataset = shaped_dataset(point, clients)
    run = tpu_compile.compile_run(config, dataset, target, client_loop_trips(dataset))
    return {
        "clients": clients, "fits": run.fits, "need_bytes": run.need_bytes,
        "hbm_bytes": run.hbm_bytes, "store": run.store, "seconds": run.seconds,
        "refused": None if run.refused is None else run.refused.message,
        "programs": {p.name: {"need_bytes": p.need_bytes, "argument_bytes": p.argument_bytes,
                              "temp_bytes": p.temp_bytes, "padding_bytes": p.padding_bytes,
                              "logical_bytes": p.logical_bytes, "fusions": p.fusions}
                     for p in run.programs},
    }


def largest_fit(point: Point, target: str, start: int, log) -> dict:
    """The largest client count that fits `target`, bracketed within 2% by the compiler: the
    need is nearly linear in the clients, so it is measured at two counts, the line through
    them gives where it meets the HBM, and the compiler is asked at 1% below and 1% above
    (again, from the nearest two counts, if either answer disagrees; bisection after three
    tries). The need of a refused run is the compiler's own figure in its refusal."""
    tried = {}

    def fits(n: int) -> bool:
        if n not in tried:
            tried[n] = compiled(point, n, target)
            log(f"  {target} {n:>10,} clients: "
                f"{'fits' if tried[n]['fits'] else 'does NOT fit'} "
                f"({(tried[n]['need_bytes'] or 0) / 2**30:.2f} GiB of "
                f"{tried[n]['hbm_bytes'] / 2**30:.2f}; {tried[n]['seconds']:.0f} s)")
        return tried[n]["fits"]

    def bracket() -> tuple[int, Optional[int]]:
        fitting = [n for n in tried if tried[n]["fits"]]
        over = [n for n in tried if not tried[n]["fits"]]
        return max(fitting, default=0), min(over, default=None)

    a = start
    while not fits(a) and a > 1:
        a //= 2
    fits(2 * a)
    for _ in range(3):
        low, high = bracket()
        if high is not None and high - low <= max(1, low // 50):
            break
        known = sorted((n for n in tried if tried[n]["need_bytes"]),
                       key=lambda n: abs(n - (low + (high or 2 * low)) / 2))[:2]
        (n1, n2) = sorted(known)
        need1, need2 = tried[n1]["need_bytes"], tried[n2]["need_bytes"]
        hbm = tried[n1]["hbm_bytes"]
        crossing = n2 + (hbm - need2) * (n2 - n1) / (need2 - need1)
        fits(int(crossing * 0.99))
        fits(int(crossing * 1.01) + 1)
    low, high = bracket()
    while high is None or high - low > max(1, low // 50):  # the fallback
        middle = low * 2 if high is None else (low + high) // 2
        fits(middle)
        low, high = bracket()
    return {"largest": low, "fit": tried.get(low), "unfit": tried.get(high),
            "tried": sorted(tried)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--resume", action="store_true",
                        help="keep the workloads and targets --out already holds")
    args = parser.parse_args(argv)
    reason = tpu_compile.missing()
    if reason is not None:
        print(f"tpu_fit: {reason}", file=sys.stderr)
        return 2
    starts = {"fesem-mclr": 100_000, "fedavg-cnn": 5_000}
    results = {"machine": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "jax": jax.__version__,
               "libtpu": tpu_compile.libtpu_version(), "workloads": {}}
    if args.resume and Path(args.out).exists():
        results = json.loads(Path(args.out).read_text())
    began = time.perf_counter()
    for name in args.workloads.split(","):
        results["workloads"].setdefault(name, {})
        for target in args.targets.split(","):
            if target in results["workloads"][name]:
                continue
            print(f"{name} on {target}", flush=True)
            results["workloads"][name][target] = largest_fit(
                WORKLOADS[name], target, starts[name], lambda line: print(line, flush=True))
            write_json(Path(args.out), results)
    results["seconds"] = time.perf_counter() - began
    write_json(Path(args.out), results)
    for name, by_target in results["workloads"].items():
        for target, found in by_target.items():
            print(f"{name:<11} {target:<10} largest fit {found['largest']:>10,} clients")
    return 0


if __name__ == "__main__":
    sys.exit(main())
