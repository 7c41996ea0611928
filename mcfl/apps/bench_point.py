"""One point of `mcfl bench` (an algorithm, a model and a number of clients; or the clustering
step alone), measured in a Python process of its own, ``python -m mcfl.apps.bench_point
--point JSON``, which prints its record as JSON: round time, samples/s, peak memory. Its data
come from `mcfl.apps.bench_data`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

import jax
import numpy as np

from mcfl import settings
from mcfl.algorithms.clustered.fesem import FeSEMParams
from mcfl.algorithms.framework import registry
from mcfl.apps.bench_data import NUM_CLASSES, benchmark_dataset, fill_mixture
from mcfl.apps.libtpu_environment import quiet_libtpu_without_tpu
from mcfl.apps.user_environment import memory_limit
from mcfl.clustering import kmeans
from mcfl.config import RunConfig
from mcfl.data.federated import DeviceRows
from mcfl.files.run_folder import json_safe
from mcfl.models import count_params, make_model
from mcfl.planning.estimate import bound_on, estimate_run
from mcfl.planning.targets import TARGETS, for_device, measure_cpu
from mcfl.runs.runner import run
from mcfl.runtime import compile_cache, memory
from mcfl.sweeps import sweep

CLUSTERING = "kmeans"  # the `algorithm` of a point that times the clustering step alone
# Synthetic's 60 features for MCLR; MNIST-sized inputs (28 x 28) for the MLP and the CNN
FEATURES = {"mclr": 60, "mlp": 784, "cnn-fmnist": 784}
HIDDEN = (200, 200)


@dataclasses.dataclass(frozen=True)
class Point:
    """One measurement: `rounds` rounds of `algorithm`, or `rounds` calls of the clustering step
    (`algorithm` = ``"kmeans"``), on `clients` clients and `model`'s parameter count."""

    algorithm: str
    model: str
    clients: int
    rounds: int = 3
    clusters: int = 4
    rows_per_client: int = 50
    batch_size: int = 10
    seed: int = 0
    # clients training each round: a count (capped at `clients`) or a fraction; 1.0 = all
    clients_per_round: float | int = 1.0
    conv: str = "auto"  # how the CNN computes its convolutions (RunConfig.conv)
    block_size: Optional[int] = None  # clients per vmapped block (None: the planned rule)
    members: int = 0  # > 0: a sweep of this many seeds as one program (`mcfl.sweep`)
    label: str = ""  # the point's name in a suite (`mcfl.apps.bench_suite`)
    plan: bool = False  # also record `mcfl plan`'s lower bound on a round for this device

    @property
    def kind(self) -> str:
        if self.algorithm == CLUSTERING:
            return "clustering"
        return "sweep" if self.members > 0 else "train"

    @property
    def local_steps(self) -> int:
        """One epoch: the steps that visit each of a client's rows once."""
        return -(-self.rows_per_client // self.batch_size)


# ----------------------------------------------------------------------------------------------
# One point, measured in the child process


def training_config(point: Point) -> RunConfig:
    """The run of a training point: `clients_per_round` clients a round (a count is capped at
    the point's clients), one epoch of local steps, evaluation after the last round only."""
    per_round = point.clients_per_round
    if not isinstance(per_round, float):
        per_round = min(int(per_round), point.clients)

    extra = {}
    takes = settings.fields_of(registry.get(point.algorithm).params)
    if "pretrain_scale" in takes:
        # FlexCFL's cold start needs pretrain_scale * K clients: scale it down for few clients.
        default = takes["pretrain_scale"].default
        extra["pretrain_scale"] = max(1, min(default, point.clients // point.clusters))
    return RunConfig(
        algorithm=point.algorithm,
        clients=point.clients,
        rounds=point.rounds,
        seed=point.seed,
        model=point.model,
        hidden=HIDDEN,
        batch_size=point.batch_size,
        local_steps=point.local_steps,
        clients_per_round=per_round,
        conv=point.conv,
        block_size=point.block_size,
        eval_every=point.rounds,
        **({"clusters": point.clusters} if registry.get(point.algorithm).clustered else {}),
        **extra,
    )


def _maxrss_mb() -> float:
    """Peak resident memory of this process in MB (ru_maxrss is KB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _reset_peak_rss() -> bool:
    """Reset this process's peak resident memory (Linux >= 4.0); False where that fails."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _device_peak_mb() -> Optional[float]:
    """Peak memory the accelerator allocator reports (GPU / TPU), None on CPU."""
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else peak / 2**20


def _timed_phases(build: Callable[[], Any], work: Callable[[Any], dict]) -> dict:
    """Run `build` (the inputs) then `work(inputs)`, with the peak resident memory of each:
    ``data_peak_rss_mb`` up to the inputs being built, ``run_peak_rss_mb`` from then on (None
    where the peak cannot be reset) and ``peak_rss_mb`` for the whole process."""
    start = time.perf_counter()
    inputs = build()
    data_seconds = time.perf_counter() - start
    data_peak = _maxrss_mb()
    reset = _reset_peak_rss()
    record = work(inputs)
    run_peak = _maxrss_mb()
    record.update(
        data_seconds=data_seconds,
        data_peak_rss_mb=data_peak,
        run_peak_rss_mb=run_peak if reset else None,
        peak_rss_mb=max(data_peak, run_peak),
        device_peak_mb=_device_peak_mb(),
    )
    return record


def _steady(seconds: Sequence[float]) -> float:
    """Steady-state seconds: the median of all but the first (compiling) call."""
    return statistics.median(seconds[1:] or seconds)


def _measure_training(point: Point) -> dict:
    config = training_config(point)

    def build():
        return benchmark_dataset(point.clients, FEATURES[point.model], point.rows_per_client,
                                 seed=point.seed)

    def work(dataset) -> dict:
        result = run(config, dataset=dataset)
        seconds = [row["seconds"] for row in result.rounds]
        summary = result.summary
        samples = summary["clients_per_round"] * point.local_steps * point.batch_size
        steady = _steady(seconds)
        return {
            "first_round_seconds": seconds[0],
            "seconds_per_round": steady,
            "round_seconds": seconds,
            "samples_per_round": samples,
            "samples_per_second": samples / steady,
            # initialisation (FeSEM's local models and k-means, IFCA's identities, FlexCFL's
            # cold start), with its compilation
            "init_seconds": summary["init_seconds"],
            "compile_seconds": summary["compile_seconds"],
            # the rest: the final evaluation, bookkeeping
            "other_seconds": (summary["wall_seconds"] - sum(seconds) - summary["init_seconds"]
                              - summary["compile_seconds"]),
            "num_params": summary["num_params"],
            "block_size": summary["block_size"],
            "clients_per_round": summary["clients_per_round"],
            "local_steps": point.local_steps,
            "data_mb": _dataset_mb(dataset),
            "final_accuracy_micro": summary["final_accuracy_micro"],
            "cluster_ari": summary.get("cluster_ari"),
            "backend": summary["backend"],
            "device": summary["device"],
            "config": summary["config"],  # the full run config, to reproduce the point
            **(_planned(config, dataset) if point.plan else {}),
        }

    return _timed_phases(build, work)


def _planned(config: RunConfig, dataset) -> dict:
    """`mcfl plan`'s lower bound on a round of `config` on this machine's device (`cpu-here`
    on a CPU), to print beside the measured round."""
    name = for_device(jax.devices()[0])
    target = measure_cpu(memory.host_available()) if name == "cpu-here" else TARGETS.get(name)
    if target is None:
        return {"plan_target": None}
    estimate = estimate_run(config, dataset, compile=False)
    bound = bound_on(estimate, target, config.precision)
    return {"plan_target": name, "plan_round_seconds": bound.round_seconds,
            "plan_bound_by": bound.limit, "plan_round_flops": estimate.program("round").cost.flops,
            "plan_round_bytes": estimate.program("round").cost.bytes}


def _measure_sweep(point: Point) -> dict:
    """A sweep of `members` seeds as one program: its second call's seconds per round (the
    first compiles), and per member-round."""
    config = training_config(point)

    def build():
        return benchmark_dataset(point.clients, FEATURES[point.model], point.rows_per_client,
                                 seed=point.seed)

    def work(dataset) -> dict:
        walls = []
        for _ in range(2):  # the second call reuses the first one's programs
            start = time.perf_counter()
            sweep(config, seeds=point.members, dataset=dataset)
            walls.append(time.perf_counter() - start)
        per_round = walls[-1] / point.rounds
        return {"first_round_seconds": walls[0] / point.rounds, "seconds_per_round": per_round,
                "seconds_per_member_round": per_round / point.members,
                "sweep_seconds": walls, "clients_per_round": config.clients_per_round,
                "backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind)}

    return _timed_phases(build, work)


def _dataset_mb(dataset) -> float:
    return sum(leaf.nbytes for leaf in jax.tree.leaves(dataset.arrays)) / 2**20


def model_num_params(model: str) -> int:
    """Parameters of the benchmark's `model` (MCLR 60 -> 10, or MLP 784-200-200-10)."""
    spec = make_model(model, (FEATURES[model],), NUM_CLASSES, HIDDEN)
    return count_params(jax.eval_shape(spec.init, jax.random.key(0)))


def _measure_clustering(point: Point) -> dict:
    """Time FeSEM's clustering step alone: k-means (K = `clusters`, FeSEM's default restarts)
    on one vector of the model's parameter count per client, in K planted groups."""
    restarts = FeSEMParams().restarts
    num_params = model_num_params(point.model)

    def build():
        rng = np.random.default_rng(point.seed)
        centers = rng.standard_normal((point.clusters, num_params), dtype=np.float32)
        group = np.arange(point.clients) % point.clusters
        vectors = DeviceRows((point.clients, num_params))  # built on the device, no host copy
        fill_mixture(rng, vectors, centers, group, scale=0.5)
        return jax.block_until_ready(vectors.array)

    def work(vectors) -> dict:
        step = jax.jit(kmeans, static_argnames=("k", "restarts"))
        seconds = []
        for r in range(point.rounds):
            start = time.perf_counter()
            result = jax.block_until_ready(
                step(jax.random.key(r), vectors, k=point.clusters, restarts=restarts)
            )
            seconds.append(time.perf_counter() - start)
        return {
            "first_round_seconds": seconds[0],
            "seconds_per_round": _steady(seconds),
            "round_seconds": seconds,
            "num_params": num_params,
            "restarts": restarts,
            "lloyd_iterations": int(result.n_iter),
            "data_mb": vectors.nbytes / 2**20,
            "backend": jax.default_backend(),
            "device": str(jax.devices()[0].device_kind),
        }

    return _timed_phases(build, work)


def measure_point(point: Point) -> dict:
    """Measure `point` in this process; returns its record (settings plus measurements)."""
    measure = {"clustering": _measure_clustering, "sweep": _measure_sweep,
               "train": _measure_training}[point.kind]
    return {**point_settings(point), "status": "ok", **measure(point)}


def point_settings(point: Point) -> dict:
    return {"kind": point.kind, **dataclasses.asdict(point)}


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m mcfl.apps.bench_point --point JSON``: measure one point, print its record
    as JSON."""
    if argv is None:  # run as the program (mcfl bench's child): its environment is its own
        quiet_libtpu_without_tpu()  # (already named where mcfl bench started it)
    parser = argparse.ArgumentParser(prog="python -m mcfl.apps.bench_point")
    parser.add_argument("--point", required=True, help="a Point as JSON")
    parser.add_argument("--no-compile-cache", action="store_true",
                        help="do not keep compiled programs in JAX's persistent cache (as "
                        "mcfl bench was told)")
    args = parser.parse_args(argv)

    if not args.no_compile_cache:
        compile_cache.enable()
    with memory.limited(memory_limit()):  # MCFL_MEMORY_LIMIT, as the parent has it
        record = measure_point(Point(**json.loads(args.point)))
    print(json.dumps(json_safe(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
