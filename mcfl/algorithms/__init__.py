"""Algorithm registry: build a `FederatedAlgorithm` from a `RunConfig`."""

from __future__ import annotations

import optax

from mcfl.algorithms.base import FederatedAlgorithm
from mcfl.algorithms.cfl import cfl
from mcfl.algorithms.fedavg import fedavg, fedprox
from mcfl.algorithms.fedgroup import fedgroup, flexcfl
from mcfl.algorithms.fedsgd import fedsgd
from mcfl.algorithms.fesem import fesem
from mcfl.algorithms.ifca import ifca
from mcfl.algorithms.local import local
from mcfl.config import RunConfig
from mcfl.engine import LocalTraining
from mcfl.models import ModelSpec

__all__ = [
    "FederatedAlgorithm",
    "fedavg",
    "fedprox",
    "fedsgd",
    "local",
    "fesem",
    "ifca",
    "cfl",
    "fedgroup",
    "flexcfl",
    "build_algorithm",
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
    return LocalTraining(
        apply_fn=model.apply,
        optimizer=client_optimizer(config),
        batch_size=config.batch_size,
        local_epochs=config.local_epochs,
        local_steps=config.local_steps,
        mu=config.effective_mu,
        sgd_lr=config.lr if plain_sgd(config) else None,
        dense_layers=model.dense_layers,
        low_rank=config.low_rank,
        factored=model.factored,
    )


def plain_sgd(config: RunConfig) -> bool:
    """Whether the clients' optimizer is ``optax.sgd(lr)`` and nothing else."""
    return config.client_optimizer == "sgd" and config.weight_decay == 0


def build_algorithm(
    config: RunConfig, model: ModelSpec, clients_per_round: int, block_size: int
) -> FederatedAlgorithm:
    """The config's algorithm, trained on data that shifts if the config asks for it."""
    from mcfl.shift import with_shift

    algorithm = _base_algorithm(config, model, clients_per_round, block_size)
    return with_shift(algorithm, config.shift, config.shift_prob, config.shift_interval)


def _base_algorithm(
    config: RunConfig, model: ModelSpec, clients_per_round: int, block_size: int
) -> FederatedAlgorithm:
    training = local_training(config, model)
    if config.algorithm in ("fedavg", "fedprox"):
        name = config.algorithm
        return fedavg(model, training, clients_per_round, block_size, config.server_lr, name=name)
    if config.algorithm == "fedsgd":
        return fedsgd(model, optax.sgd(config.lr), clients_per_round, block_size)
    if config.algorithm == "fesem":
        return fesem(
            model, training, clients_per_round, block_size, config.clusters,
            lam=config.fesem_lambda, restarts=config.fesem_restarts,
            last_layer=config.fesem_last_layer, weighted=config.fesem_weighted,
        )
    if config.algorithm == "ifca":
        return ifca(model, training, clients_per_round, block_size, config.clusters)
    if config.algorithm == "cfl":
        return cfl(
            model, training, clients_per_round, block_size, config.clusters,
            eps1=config.cfl_eps1, eps2=config.cfl_eps2, warmup=config.cfl_warmup,
        )
    if config.algorithm in ("fedgroup", "flexcfl"):
        migration = config.migration if config.algorithm == "flexcfl" else None
        return fedgroup(
            model, training, clients_per_round, block_size, config.clusters,
            pretrain_scale=config.pretrain_scale, measure=config.measure, eta_g=config.eta_g,
            migration=migration, name=config.algorithm,
        )
    return local(model, training, clients_per_round, block_size)
