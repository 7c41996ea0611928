"""The peer workload's FedAvg round in mcfl (run from mcfl's .venv), and the centralized ceiling.

    .venv/bin/python benchmarks/peers/mcfl_round.py --clients 1000 --json mcfl.json
    .venv/bin/python benchmarks/peers/mcfl_round.py --low-rank off      # per-client kernels
    .venv/bin/python benchmarks/peers/mcfl_round.py --centralized       # the ceiling
    .venv/bin/python benchmarks/peers/mcfl_round.py --check

mcfl's FedAvg (all clients, 5 local steps of B = 10, lr 0.01, weights n_i = 50 so the average
is the plain mean) as `mcfl run` compiles it: one jitted round. mcfl shuffles each client's rows
every epoch; so that round 1 visits the rows in the workload's order (and `--check` can compare
with the NumPy oracle), each client's rows are stored pre-permuted by the inverse of round 1's
shuffle. Later rounds shuffle differently, at the same cost.

`--centralized`: the same number of sample-gradients (C x 50) on one shared model in one batch,
plus the SGD step: what the arithmetic costs without per-client models (the issue's ceiling).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import workload as wl  # noqa: E402

from mcfl import engine  # noqa: E402
from mcfl.algorithms import local_training  # noqa: E402
from mcfl.config import RunConfig  # noqa: E402
from mcfl.data.federated import from_splits  # noqa: E402
from mcfl.engine.batch_rule import epoch_positions  # noqa: E402
from mcfl.models import make_model  # noqa: E402
from mcfl.runs.execution import RunPlan  # noqa: E402
from mcfl.runs.program import RoundProgram  # noqa: E402

ROWS = 50


FLAX_LAYOUT = ("Dense_{}", "kernel", "bias")


def to_flax(params: dict[str, np.ndarray]) -> dict:
    return jax.tree.map(jnp.asarray, wl.nest_layers(params, *FLAX_LAYOUT))


def from_flax(params: dict) -> dict[str, np.ndarray]:
    return wl.flatten_layers(params, *FLAX_LAYOUT)


def federated(x: np.ndarray, y: np.ndarray):
    c = x.shape[0]
    owner = np.repeat(np.arange(c), x.shape[1])
    flat_x, flat_y = x.reshape(-1, x.shape[-1]), y.reshape(-1)
    test = (flat_x[:c], flat_y[:c], np.arange(c))
    return from_splits("peers", (flat_x, flat_y, owner), test, c, 10)


class McflRunner:
    """mcfl's jitted FedAvg round, started from the workload's parameters."""

    def __init__(self, work: wl.Workload, args):
        c = work.num_clients
        self.config = RunConfig(algorithm="fedavg", clients=c, rounds=1, model="mlp",
                                hidden=(200, 200), lr=wl.LEARNING_RATE, batch_size=10,
                                local_steps=5, clients_per_round=1.0, low_rank=args.low_rank)
        model = make_model("mlp", (784,), 10, (200, 200))
        self.rounds_key = jax.random.split(jax.random.key(0))[1]
        training_key = jax.random.split(jax.random.fold_in(self.rounds_key, 1))[1]
        # Row k of client i goes where round 1 reads client i's k-th row (epoch 0's order).
        positions = jax.vmap(lambda i: epoch_positions(training_key, i, 0, ROWS))(
            jnp.arange(c, dtype=jnp.int32))
        orders = np.asarray(positions + ROWS * jnp.arange(c)[:, None]).reshape(-1)
        x = np.empty_like(work.x.reshape(-1, 784))
        y = np.empty_like(work.y.reshape(-1))
        x[orders] = work.x.reshape(-1, 784)
        y[orders] = work.y.reshape(-1)
        self.data = federated(x.reshape(work.x.shape), y.reshape(work.y.shape)).arrays
        params_count = sum(v.size for v in work.params.values())
        low_rank = engine.low_rank_capacity(
            local_training(self.config, model), self.data,
            jax.tree.map(lambda a: a[None], to_flax(work.params))) is not None
        block = args.block_size or engine.default_block_size(params_count, c, low_rank=low_rank)
        self.block, self.low_rank = block, low_rank
        # mcfl's own round program, with the block size chosen here
        self.program = RoundProgram(self.config, RunPlan(model, params_count, c, low_rank, block,
                                                         block))
        init_key = jax.random.key(0)
        self.program.compile_init({}, init_key, self.data)
        state = self.program.init({}, init_key, self.data)  # (a `DeviceState`)
        self.state = state.replace(algorithm=state.algorithm.replace(
            params=to_flax(work.params)))
        self.r = 0
        # As `mcfl run`: no mesh for one device (arrays placed under a mesh carry its sharding,
        # and a first round fed unsharded arrays would compile twice).
        mesh = engine.client_mesh(args.devices) if args.devices > 1 else None
        self.mesh = (lambda: jax.set_mesh(mesh)) if mesh else contextlib.nullcontext
        if mesh is not None:  # replicated on the mesh, as round 1's outputs will be
            replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            self.state, self.data = jax.device_put((self.state, self.data), replicated)
        with self.mesh():
            self.program.compile_rounds({}, self.state, self.rounds_key, self.data)

    def run_round(self) -> None:
        self.r += 1
        with self.mesh():
            self.state, _ = self.program.rounds(1, {}, self.state, self.data, self.rounds_key,
                                                self.r)
        jax.block_until_ready(self.state)

    def global_params(self) -> dict[str, np.ndarray]:
        return from_flax(self.state.algorithm.params)


class CentralizedRunner:
    """One SGD step on one shared model over all C x 50 rows at once (the ceiling)."""

    def __init__(self, work: wl.Workload, args):
        del args
        model = make_model("mlp", (784,), 10, (200, 200))
        self.x = jnp.asarray(work.x.reshape(-1, 784))
        self.y = jnp.asarray(work.y.reshape(-1))
        self.params = to_flax(work.params)

        def loss(p, x, y):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

        @jax.jit
        def step(p, x, y):
            g = jax.grad(loss)(p, x, y)
            return jax.tree.map(lambda a, b: a - wl.LEARNING_RATE * b, p, g)

        self.step = step

    def run_round(self) -> None:
        self.params = jax.block_until_ready(self.step(self.params, self.x, self.y))

    def global_params(self) -> dict[str, np.ndarray]:
        return from_flax(self.params)


def make_runner(work, args):
    return CentralizedRunner(work, args) if args.centralized else McflRunner(work, args)


def describe(args) -> dict:
    if args.centralized:
        name = "centralized ceiling (one model, one batch)"
    else:
        name = f"mcfl FedAvg (low-rank {args.low_rank})"
        if args.devices > 1:
            name += f", {args.devices} CPU devices"
    return {"name": name, "jax_version": jax.__version__, "backend": jax.default_backend(),
            "device": jax.devices()[0].device_kind}


def add_arguments(parser) -> None:
    parser.add_argument("--low-rank", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--centralized", action="store_true")
    parser.add_argument("--devices", type=int, default=1,
                        help="shard the clients over this many local devices")


if __name__ == "__main__":
    sys.exit(harness.main(make_runner, describe, add_arguments))
