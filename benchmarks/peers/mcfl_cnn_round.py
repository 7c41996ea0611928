"""The CNN workload's FedAvg round in mcfl (run from mcfl's .venv), and the centralized ceiling.

    .venv/bin/python benchmarks/peers/mcfl_cnn_round.py --clients 20 --rounds 4
    .venv/bin/python benchmarks/peers/mcfl_cnn_round.py --low-rank off   # the kernel dense
    .venv/bin/python benchmarks/peers/mcfl_cnn_round.py --conv xla       # flax nn.Conv
    .venv/bin/python benchmarks/peers/mcfl_cnn_round.py --centralized    # the ceiling
    .venv/bin/python benchmarks/peers/mcfl_cnn_round.py --check --check-clients 4

mcfl's FedAvg on model ``cnn-fmnist`` (all clients, 12 local steps of B = 10, lr 0.01, every
client 120 rows so the average is the plain mean), one jitted round as `mcfl run` compiles it.
As in ``mcfl_round.py``, each client's rows are stored pre-permuted by the inverse of round 1's
shuffle, so that round 1 visits them in the workload's order and `--check` can compare with the
NumPy oracle.

`--centralized`: the same 20 x 12 batches of 10 as one model's 12 steps of batch 200 (step s
takes every client's batch s), with the same convolution code: what the arithmetic costs
without per-client models (the issue's ceiling).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cnn_workload as cw  # noqa: E402
import harness  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from mcfl import engine  # noqa: E402
from mcfl.config import RunConfig  # noqa: E402
from mcfl.data.federated import from_splits  # noqa: E402
from mcfl.engine.batch_rule import epoch_positions  # noqa: E402
from mcfl.models import make_model  # noqa: E402
from mcfl.runs.execution import RunPlan  # noqa: E402
from mcfl.runs.program import RoundProgram  # noqa: E402

LAYERS = {"conv0": "Conv_0", "conv1": "Conv_1", "dense0": "Dense_0", "dense1": "Dense_1"}


def to_flax(params: dict[str, np.ndarray]) -> dict:
    return {flax: {"kernel": jnp.asarray(params[name]), "bias": jnp.asarray(params[name + "_bias"])}
            for name, flax in LAYERS.items()}


def from_flax(params: dict) -> dict[str, np.ndarray]:
    out = {}
    for name, flax in LAYERS.items():
        out[name] = np.asarray(params[flax]["kernel"])
        out[name + "_bias"] = np.asarray(params[flax]["bias"])
    return out


def federated(x: np.ndarray, y: np.ndarray):
    c, rows = x.shape[:2]
    owner = np.repeat(np.arange(c), rows)
    test = (x[:, 0], y[:, 0], np.arange(c))
    return from_splits("peers-cnn", (x.reshape(-1, cw.NUM_FEATURES), y.reshape(-1), owner), test,
                       c, cw.NUM_CLASSES)


class McflRunner:
    """mcfl's FedAvg round on the CNN, compiled once, started from the workload's parameters."""

    def __init__(self, work: cw.Workload, args):
        c = work.num_clients
        config = RunConfig(algorithm="fedavg", clients=c, rounds=1, model="cnn-fmnist",
                           lr=cw.LEARNING_RATE, batch_size=cw.BATCH_SIZE,
                           local_steps=cw.LOCAL_STEPS, clients_per_round=1.0,
                           low_rank=args.low_rank, conv=args.conv)
        model = make_model("cnn-fmnist", (cw.NUM_FEATURES,), cw.NUM_CLASSES, conv=args.conv)
        self.rounds_key = jax.random.split(jax.random.key(0))[1]
        training_key = jax.random.split(jax.random.fold_in(self.rounds_key, 1))[1]
        rows = cw.ROWS_PER_CLIENT
        # Row k of client i goes where round 1 reads client i's k-th row (epoch 0's order).
        positions = jax.vmap(lambda i: epoch_positions(training_key, i, 0, rows))(
            jnp.arange(c, dtype=jnp.int32))
        orders = np.asarray(positions + rows * jnp.arange(c)[:, None]).reshape(-1)
        x = np.empty_like(work.x.reshape(-1, cw.NUM_FEATURES))
        y = np.empty_like(work.y.reshape(-1))
        x[orders] = work.x.reshape(-1, cw.NUM_FEATURES)
        y[orders] = work.y.reshape(-1)
        self.data = federated(x.reshape(work.x.shape), y.reshape(work.y.shape)).arrays
        params_count = sum(v.size for v in work.params.values())
        block = args.block_size or engine.default_block_size(params_count, c)
        # mcfl's own round program, with the block size chosen here
        self.program = RoundProgram(config, RunPlan(model, params_count, c, False, block, block))
        init_key = jax.random.key(0)
        self.program.compile_init({}, init_key, self.data)
        state = self.program.init({}, init_key, self.data)  # (a `DeviceState`)
        self.state = state.replace(algorithm=state.algorithm.replace(
            params=to_flax(work.params)))
        mesh = engine.client_mesh(args.devices) if args.devices > 1 else None
        self.mesh = (lambda: jax.set_mesh(mesh)) if mesh else contextlib.nullcontext
        if mesh is not None:  # replicated on the mesh, as round 1's outputs will be
            replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            self.state, self.data = jax.device_put((self.state, self.data), replicated)
        with self.mesh():
            self.program.compile_rounds({}, self.state, self.rounds_key, self.data)
        self.r = 0

    def run_round(self) -> None:
        self.r += 1
        with self.mesh():
            self.state, _ = self.program.rounds(1, {}, self.state, self.data, self.rounds_key,
                                                self.r)
        jax.block_until_ready(self.state)

    def global_params(self) -> dict[str, np.ndarray]:
        return from_flax(self.state.algorithm.params)


class CentralizedRunner:
    """12 SGD steps of one model on batches of 200 (every client's batch s in step s)."""

    def __init__(self, work: cw.Workload, args):
        model = make_model("cnn-fmnist", (cw.NUM_FEATURES,), cw.NUM_CLASSES, conv=args.conv)
        b = cw.BATCH_SIZE
        # [steps, C * B, 784]: step s holds rows s*B .. s*B + B - 1 of every client
        x = work.x.reshape(work.num_clients, cw.LOCAL_STEPS, b, -1).swapaxes(0, 1)
        y = work.y.reshape(work.num_clients, cw.LOCAL_STEPS, b).swapaxes(0, 1)
        self.x = jnp.asarray(x.reshape(cw.LOCAL_STEPS, -1, cw.NUM_FEATURES))
        self.y = jnp.asarray(y.reshape(cw.LOCAL_STEPS, -1))
        self.params = to_flax(work.params)

        def loss(p, xb, yb):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, xb), yb).mean()

        @jax.jit
        def train(p, x, y):
            def step(p, batch):
                g = jax.grad(loss)(p, *batch)
                return jax.tree.map(lambda a, b: a - cw.LEARNING_RATE * b, p, g), None

            return jax.lax.scan(step, p, (x, y))[0]

        self.train = train
        jax.block_until_ready(train(self.params, self.x, self.y))  # compile outside the timing

    def run_round(self) -> None:
        self.params = jax.block_until_ready(self.train(self.params, self.x, self.y))

    def global_params(self) -> dict[str, np.ndarray]:
        return from_flax(self.params)


def make_runner(work, args):
    return CentralizedRunner(work, args) if args.centralized else McflRunner(work, args)


def describe(args) -> dict:
    if args.centralized:
        name = f"centralized ceiling (one model, batch 200, conv {args.conv})"
    else:
        name = f"mcfl FedAvg (low-rank {args.low_rank}, conv {args.conv})"
        if args.devices > 1:
            name += f", {args.devices} CPU devices"
    return {"name": name, "jax_version": jax.__version__, "backend": jax.default_backend(),
            "device": jax.devices()[0].device_kind}


def add_arguments(parser) -> None:
    parser.add_argument("--low-rank", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--conv", choices=("auto", "matmul", "xla"), default="auto")
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--centralized", action="store_true")
    parser.add_argument("--devices", type=int, default=1,
                        help="shard the clients over this many local devices")


if __name__ == "__main__":
    sys.exit(harness.main(make_runner, describe, add_arguments, workload=cw))
