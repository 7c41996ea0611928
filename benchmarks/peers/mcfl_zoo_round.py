"""A zoo workload's FedAvg round (`zoo_workload.py`) in mcfl (run from mcfl's .venv).

    .venv/bin/python benchmarks/peers/mcfl_zoo_round.py --model cnn-cifar --rounds 4
    .venv/bin/python benchmarks/peers/mcfl_zoo_round.py --model resnet18-gn --conv xla
    .venv/bin/python benchmarks/peers/mcfl_zoo_round.py --model char-lstm --check --quick

mcfl's FedAvg on the registered model (all clients, 5 local steps of B = 10, lr 0.01, every
client 50 rows so the average is the plain mean), one jitted round as `mcfl run` compiles it,
built as ``mcfl_cnn_round.py`` builds its round: the model from the registry
(`make_model(name, ..., model_args=...)`, which also takes the `--quick` widths), a
`RoundProgram` over a `RunPlan` holding it. The program takes the model from the plan; the
config names the same model when `RunConfig` accepts it, and a placeholder otherwise (the
result's ``config_model`` says which), since config.MODELS may not list the zoo yet.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import zoo_workload as zw  # noqa: E402

from mcfl import engine  # noqa: E402
from mcfl.config import RunConfig  # noqa: E402
from mcfl.data.federated import from_splits  # noqa: E402
from mcfl.errors import ConfigError  # noqa: E402
from mcfl.models import count_params, make_model  # noqa: E402
from mcfl.runs.execution import RunPlan  # noqa: E402
from mcfl.runs.program import RoundProgram  # noqa: E402


def run_config(model: str, clients: int, args) -> RunConfig:
    settings = dict(algorithm="fedavg", clients=clients, rounds=1, lr=zw.LEARNING_RATE,
                    batch_size=zw.BATCH_SIZE, local_steps=zw.LOCAL_STEPS,
                    clients_per_round=1.0, low_rank=args.low_rank, conv=args.conv)
    try:
        return RunConfig(model=model, **settings)
    except ConfigError:  # the config's model list does not name the zoo yet
        return RunConfig(model="mclr", **settings)


class McflZooRunner:
    """mcfl's FedAvg round on a zoo model, compiled once."""

    def __init__(self, work: zw.ZooWorkload, args):
        c, rows = work.x.shape[:2]
        self.config = run_config(work.model, c, args)
        self.notes = {"config_model": self.config.model}
        model = make_model(work.model, work.feature_shape, work.num_classes, conv=args.conv,
                           model_args=work.model_args)
        owner = np.repeat(np.arange(c), rows)
        test = (work.x[:, 0], work.y[:, 0], np.arange(c))
        self.data = from_splits(f"peers-{work.model}",
                                (work.x.reshape((-1,) + work.feature_shape), work.y.reshape(-1),
                                 owner), test, c, work.num_classes).arrays
        init_key = jax.random.key(0)
        self.param_count = count_params(jax.eval_shape(model.init, init_key))
        block = args.block_size or engine.default_block_size(self.param_count, c)
        self.program = RoundProgram(self.config, RunPlan(model, self.param_count, c, False,
                                                         block, block))
        self.program.compile_init({}, init_key, self.data)
        self.state = self.program.init({}, init_key, self.data)
        self.rounds_key = jax.random.split(init_key)[1]
        self.program.compile_rounds({}, self.state, self.rounds_key, self.data)
        self.r = 0

    def run_round(self) -> None:
        self.r += 1
        self.state, _ = self.program.rounds(1, {}, self.state, self.data, self.rounds_key,
                                            self.r)
        jax.block_until_ready(self.state)

    def global_params(self) -> dict[str, np.ndarray]:
        leaves = jax.tree_util.tree_leaves_with_path(self.state.algorithm.params)
        return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def describe(args) -> dict:
    return {"name": f"mcfl FedAvg (low-rank {args.low_rank}, conv {args.conv})",
            "jax_version": jax.__version__, "backend": jax.default_backend(),
            "device": jax.devices()[0].device_kind}


def add_arguments(parser) -> None:
    parser.add_argument("--low-rank", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--conv", choices=("auto", "matmul", "xla"), default="auto")
    parser.add_argument("--block-size", type=int, default=None)


if __name__ == "__main__":
    sys.exit(zw.main(McflZooRunner, describe, add_arguments))
