"""The algorithms, each registered under its name (`mcfl.algorithms.registry`), and the bridge
from a `RunConfig` to a built algorithm."""
# ruff: noqa: I001  (the algorithm imports are in registration order, which is the CLI's order)

from __future__ import annotations

from typing import TYPE_CHECKING

import optax

# Importing a module registers its algorithms; this order is the order of the CLI's choices
# and of the README's table.
from mcfl.algorithms import fedavg as _fedavg  # noqa: F401
from mcfl.algorithms import fedsgd as _fedsgd  # noqa: F401
from mcfl.algorithms import local as _local  # noqa: F401
from mcfl.algorithms import feddist as _feddist  # noqa: F401
from mcfl.algorithms import feddane as _feddane  # noqa: F401
from mcfl.algorithms import fesem as _fesem  # noqa: F401
from mcfl.algorithms import fesem_ma as _fesem_ma  # noqa: F401
from mcfl.algorithms import ifca as _ifca  # noqa: F401
from mcfl.algorithms import cfl as _cfl  # noqa: F401
from mcfl.algorithms import robust as _robust  # noqa: F401
from mcfl.algorithms import fedgroup as _fedgroup  # noqa: F401
from mcfl.algorithms.base import FederatedAlgorithm
from mcfl.algorithms.registry import AlgorithmContext, AlgorithmSpec, build, get, names, register
from mcfl.engine import LocalTraining
from mcfl.models import ModelSpec

if TYPE_CHECKING:
    from mcfl.config import RunConfig

__all__ = [
    "AlgorithmContext",
    "AlgorithmSpec",
    "FederatedAlgorithm",
    "build",
    "build_algorithm",
    "context_of",
    "get",
    "local_training",
    "names",
    "register",
]


def client_optimizer(config: RunConfig) -> optax.GradientTransformation:
    """The clients' optax optimizer named by the config (weight decay as an L2 gradient term)."""
    if config.client_optimizer == "sgd":
        opt = optax.sgd(config.lr)
    elif config.client_optimizer == "momentum":
        opt = optax.sgd(config.lr, momentum=config.momentum)
    else:
        opt = optax.adam(config.lr)
    if config.weight_decay > 0:
        opt = optax.chain(optax.add_decayed_weights(config.weight_decay), opt)
    return opt


def local_training(config: RunConfig, model: ModelSpec) -> LocalTraining:
    """The clients' local training the config describes (no proximal term: an algorithm that
    wants one, FedProx or FeSEM, adds its own)."""
    return LocalTraining(
        apply_fn=model.apply,
        optimizer=client_optimizer(config),
        batch_size=config.batch_size,
        local_epochs=config.local_epochs,
        local_steps=config.local_steps,
        sgd_lr=config.lr if plain_sgd(config) else None,
        dense_layers=model.dense_layers,
        low_rank=config.low_rank,
        factored=model.factored,
    )


def plain_sgd(config: RunConfig) -> bool:
    """Whether the clients' optimizer is ``optax.sgd(lr)`` and nothing else."""
    return config.client_optimizer == "sgd" and config.weight_decay == 0


def context_of(config: RunConfig, model: ModelSpec, clients_per_round: int,
               block_size: int) -> AlgorithmContext:
    """What every algorithm is built from, as the config says."""
    return AlgorithmContext(model, local_training(config, model), clients_per_round, block_size,
                            config.clusters if config.clustered else 1, config.lr)


def build_algorithm(config: RunConfig, model: ModelSpec, clients_per_round: int,
                    block_size: int) -> FederatedAlgorithm:
    """The config's algorithm with its hyperparameters, trained on data that shifts if the
    config asks for it, on the clients its schedule names."""
    from mcfl.schedule import with_schedule
    from mcfl.shift import with_shift

    context = context_of(config, model, clients_per_round, block_size)
    algorithm = get(config.algorithm).factory(context, config.params)
    shifted = with_shift(algorithm, config.shift, config.shift_prob, config.shift_interval)
    return with_schedule(shifted, config.client_sampling, clients_per_round)
