"""FeSEM's small rounds: the block rule and round scanning forced on and off, beside `mcfl plan`'s
bound, in one process.

    .venv/bin/python benchmarks/small_rounds.py --out runs/small-rounds

FeSEM (K = 4), MCLR 60 -> 10, 100,000 clients (`mcfl bench`'s planted data, 50 rows each), 100
a round of 5 steps, 30 rounds; s/round is the median of rounds 2-30. The dataset is built once;
the variants run one after another, `--passes` times over (the first pass compiles each one):
- ``block8-off``: blocks of 8, a host call a round (the defaults before issue 42);
- ``block8-on``: blocks of 8, the rounds scanned;
- ``default-off``: the block rule's size, a host call a round (``--scan-rounds off``);
- ``default``: the defaults (the block rule, ``--scan-rounds auto``).
Prints each variant's s/round and its ratio to the bound for ``cpu-here`` (this CPU's matmul
rate and copy bandwidth, measured in the same process), and writes OUT/small_rounds.json.

Beside them, ``floor``: the round's local training written as plain JAX with nothing of mcfl's
(100 clients' MCLR weights, 5 SGD steps of 10 rows each already gathered in memory, one jitted
`fori_loop`, the gradient by autodiff vmapped over clients), i.e. what a round's compute alone
costs on this CPU before any sampling, batch order, row gather, masking or server step. When the
floor is itself several times the plan's bound, the bound (bytes and FLOPs at the CPU's peak
rates) is not reachable by kernels of this size: the gap is per-kernel cost, not mcfl's work.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from mcfl import run  # noqa: E402
from mcfl.apps.bench_data import benchmark_dataset  # noqa: E402
from mcfl.apps.bench_point import FEATURES, Point, _planned, training_config  # noqa: E402
from mcfl.files.atomic import write_json  # noqa: E402

VARIANTS = {"block8-off": {"block_size": 8, "scan_rounds": "off"},
            "block8-on": {"block_size": 8, "scan_rounds": "on"},
            "default-off": {"scan_rounds": "off"},
            "default": {}}


def local_steps_floor(clients: int = 100, steps: int = 5, rows: int = 10, features: int = 60,
                      classes: int = 10, calls: int = 200) -> float:
    """Median seconds of `steps` vmapped MCLR SGD steps of `clients` as plain JAX, the batches
    already in memory (see the module docstring): the floor under a round's local training."""
    generator = np.random.default_rng(0)
    x = jnp.asarray(generator.normal(size=(clients, steps, rows, features)), jnp.float32)
    y = jnp.asarray(generator.integers(0, classes, (clients, steps, rows)), jnp.int32)
    weights = (jnp.zeros((clients, features, classes)), jnp.zeros((clients, classes)))

    def loss(params, x, y):
        logits = x @ params[0] + params[1]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    gradient = jax.vmap(jax.grad(loss))

    @jax.jit
    def train(params, x, y):
        def step(i, params):
            grads = gradient(params, x[:, i], y[:, i])
            return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
        return jax.lax.fori_loop(0, steps, step, params)

    jax.block_until_ready(train(weights, x, y))
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(train(weights, x, y))
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/small-rounds"))
    parser.add_argument("--clients", type=int, default=100_000)
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    point = Point("fesem", "mclr", args.clients, rounds=30, clients_per_round=100)
    base = training_config(point)
    dataset = benchmark_dataset(point.clients, FEATURES[point.model], point.rows_per_client,
                                seed=0)
    bound = _planned(base, dataset)
    document = {"plan": bound, "variants": {name: [] for name in VARIANTS}, "floor": []}
    print(f"plan's bound: {1000 * bound['plan_round_seconds']:.3f} ms a round "
          f"({bound['plan_bound_by']}-bound)", flush=True)
    for number in range(args.passes):
        floor = local_steps_floor(steps=point.local_steps, rows=point.batch_size,
                                  features=FEATURES[point.model])
        document["floor"].append(floor)
        write_json(args.out / "small_rounds.json", document)
        print(f"pass {number + 1} {'floor':<12} {1000 * floor:7.3f} ms a round (plain JAX local "
              f"steps), {floor / bound['plan_round_seconds']:.1f}x the bound", flush=True)
        for name, changes in VARIANTS.items():
            result = run(base.replace(**changes), dataset=dataset)
            seconds = statistics.median(row["seconds"] for row in result.rounds[1:])
            document["variants"][name].append(
                {"seconds_per_round": seconds, "block_size": result.summary["block_size"]})
            write_json(args.out / "small_rounds.json", document)
            print(f"pass {number + 1} {name:<12} {1000 * seconds:7.3f} ms a round, block "
                  f"{result.summary['block_size']}, "
                  f"{seconds / bound['plan_round_seconds']:.1f}x the bound", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
