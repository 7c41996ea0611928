"""The execution plan of a run: what a config and its dataset fix before anything is compiled.

The plan holds the model and its size, the clients a round, whether rounds train on the
factored path, and how many clients a block of the engine holds (in training and in
evaluation): execution details the algorithm receives in its context (`AlgorithmContext.
block_size`) and passes to the engine, never chooses. It also
gives a run's PRNG keys and the device mesh its clients are sharded over.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax

from mcfl import engine
from mcfl.algorithms import local_training
from mcfl.config import RunConfig
from mcfl.data import FederatedDataset
from mcfl.engine.sampling import resolve_clients_per_round
from mcfl.errors import ConfigError, DataError
from mcfl.models import count_params, make_model
from mcfl.models.build import model_of
from mcfl.runtime import distributed


class RunPlan(NamedTuple):
    """What a config and its dataset fix before training (shared by `mcfl.run` and the
    members of a sweep)."""

    model: Any  # mcfl.models.ModelSpec
    params_count: int
    clients_per_round: int
    low_rank: bool  # rounds train on the factored path
    block_size: int  # clients per vmapped block in training
    eval_block: int  # ... in evaluation

    @property
    def train_block(self) -> int:
        """The block size of a round's work (training, gradients, losses): at most a round's
        clients."""
        return min(self.block_size, self.clients_per_round)


def plan_run(config: RunConfig, dataset: FederatedDataset, model: Any = None) -> RunPlan:
    """The plan of `config` on `dataset` (a dataset without test rows is refused: runs are
    scored on them), training `model` (a flax module, factory or `ModelSpec`) when given, else
    the config's."""
    if int(dataset.test_counts().sum()) == 0:
        where = ("its test/*.json files list none of them, or give --test-fraction to split "
                 "their rows" if config.dataset == "leaf" else
                 "give a larger --test-fraction or --samples-per-client, or fewer --clients so "
                 "that each holds more rows")
        raise DataError(f"the dataset {dataset.name!r} has no test rows for its "
                        f"{dataset.num_clients} client(s); runs are scored on test rows: "
                        f"{where}")
    model = make_model(model_of(config.model, model), dataset.feature_shape,
                       dataset.num_classes, config.hidden, config.conv,
                       model_args=config.model_args, fast_paths=config.fast_paths,
                       precision=config.precision)
    init_key = jax.random.key(0)  # shapes only
    params_count = count_params(jax.eval_shape(model.init, init_key))
    per_round = resolve_clients_per_round(config.clients_per_round, dataset.num_clients)
    # Whether rounds will train on the factored path (a shift's view makes every round dense).
    low_rank = config.shift == "none" and engine.low_rank_capacity(
        local_training(config, model), dataset.arrays,
        jax.eval_shape(jax.vmap(model.init), init_key[None])
    ) is not None
    # Blocks of the dense-stack path share products and want many clients; a CNN's factored
    # layer is per client, sized like the per-client path.
    block_size = config.block_size or engine.default_block_size(
        params_count, per_round, low_rank=low_rank and model.dense_layers is not None)
    eval_block = config.block_size or engine.default_block_size(params_count, dataset.num_clients)
    return RunPlan(model, params_count, per_round, low_rank, block_size, eval_block)


def seed_key(seed: int) -> jax.Array:
    """The PRNG key of a seed in [0, 2^63 - 1]. ``jax.random.key`` keeps only 32 bits without
    x64 (``key(2**40)`` is ``key(0)``), so a seed's upper bits are folded in: seeds below 2^32
    keep their plain key, and distinct seeds never share one."""
    key = jax.random.key(seed & 0xFFFFFFFF)
    high = seed >> 32
    return key if high == 0 else jax.random.fold_in(key, high)


def run_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """(initialisation key, rounds key) of a run with `seed`; round r uses
    ``fold_in(rounds_key, r)``."""
    init_key, rounds_key = jax.random.split(seed_key(seed))
    return init_key, rounds_key


def client_mesh(devices: Optional[int]) -> Optional[jax.sharding.Mesh]:
    """The mesh that shards clients over `devices` devices (None: all of them, of every
    process); None for one device. A count this machine cannot give is a `ConfigError`."""
    available = len(jax.devices())
    count = available if devices is None else devices
    if count > available:
        raise ConfigError(f"devices={count} but this machine has {available} "
                          f"{jax.default_backend()} device(s); use --devices 1..{available}")
    if distributed.process_count() > 1 and count != available:
        raise ConfigError(f"a run over {distributed.process_count()} processes uses all their "
                          f"{available} devices; leave --devices unset")
    return None if count == 1 else engine.client_mesh(count)
