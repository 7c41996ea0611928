"""The algorithms, each registered under its name (`mcfl.algorithms.registry`), and the bridge
from a `RunConfig` to a built algorithm."""
# ruff: noqa: I001  (the algorithm imports are in registration order, which is the CLI's order)

from __future__ import annotations

from typing import TYPE_CHECKING

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional

import jax


# Importing a module registers its algorithms; this order is the order of the CLI's choices
# and of the README's table.
from mcfl.algorithms import fedavg as _fedavg  # noqa: F401
from mcfl.algorithms import fedsgd as _fedsgd  # noqa: F401
from mcfl.algorithms import local as _local  # noqa: F401
from mcfl.algorithms import partial as _partial  # noqa: F401
from mcfl.algorithms import ditto as _ditto  # noqa: F401
from mcfl.algorithms import apfl as _apfl  # noqa: F401
from mcfl.algorithms import perfedavg as _perfedavg  # noqa: F401
from mcfl.algorithms import pfedme as _pfedme  # noqa: F401
from mcfl.algorithms import fedrep as _fedrep  # noqa: F401
from mcfl.algorithms import feddist as _feddist  # noqa: F401
from mcfl.algorithms import feddane as _feddane  # noqa: F401
from mcfl.algorithms import scaffold as _scaffold  # noqa: F401
from mcfl.algorithms import fednova as _fednova  # noqa: F401
from mcfl.algorithms import fesem as _fesem  # noqa: F401
from mcfl.algorithms import fesem_ma as _fesem_ma  # noqa: F401
from mcfl.algorithms import dp_fesem as _dp_fesem  # noqa: F401
from mcfl.algorithms import ifca as _ifca  # noqa: F401
from mcfl.algorithms import fedem as _fedem  # noqa: F401
from mcfl.algorithms import fedsoft as _fedsoft  # noqa: F401
from mcfl.algorithms import fedrc as _fedrc  # noqa: F401
from mcfl.algorithms import stocfl as _stocfl  # noqa: F401
from mcfl.algorithms import cfl as _cfl  # noqa: F401
from mcfl.algorithms import cflgp as _cflgp  # noqa: F401
from mcfl.algorithms import flux as _flux  # noqa: F401
from mcfl.algorithms import fedgwc as _fedgwc  # noqa: F401
from mcfl.algorithms import robust as _robust  # noqa: F401
from mcfl.algorithms import flhc as _flhc  # noqa: F401
from mcfl.algorithms import pacfl as _pacfl  # noqa: F401
from mcfl.algorithms import fedgroup as _fedgroup  # noqa: F401
from mcfl.algorithms import asynchronous as _asynchronous  # noqa: F401
from mcfl import settings
from mcfl.algorithms.base import (
    ClientModels,
    ClientState,
    Exchange,
    FederatedAlgorithm,
    Hyperparams,
    PopulationStart,
)
from mcfl.algorithms.device import DeviceState, OnDevice, on_device, scan_rounds
from mcfl.algorithms.local_norm import with_local_norm
from mcfl.algorithms.poisson import with_poisson_sampling
from mcfl.algorithms.schedule import with_schedule
from mcfl.algorithms.shift import with_shift
from mcfl.system.devices import model_megabytes, system_model
from mcfl.algorithms.system_rounds import with_system
from mcfl.algorithms.registry import AlgorithmContext, AlgorithmSpec, build, get, names, register
from mcfl.engine import LocalTraining
from mcfl.models import ModelSpec

if TYPE_CHECKING:
    from mcfl.config import RunConfig

__all__ = [
    "AlgorithmContext",
    "AlgorithmSpec",
    "ClientModels",
    "ClientState",
    "DeviceState",
    "Exchange",
    "FederatedAlgorithm",
    "Hyperparams",
    "OnDevice",
    "PopulationStart",
    "build",
    "build_algorithm",
    "context_of",
    "get",
    "hyperparams",
    "local_training",
    "names",
    "on_device",
    "register",
    "scan_rounds",
]


def local_training(config: RunConfig, model: ModelSpec,
                   values: Optional[Mapping[str, Any]] = None) -> LocalTraining:
    """The clients' local training the config describes (no proximal term: an algorithm that
    wants one, FedProx or FeSEM, adds its own); `values` (flat keys, e.g. traced arrays of a
    sweep's members) replace the config's traced settings."""
    values = values or {}
    return LocalTraining(
        apply_fn=model.apply,
        batch_size=config.batch_size,
        lr=values.get("lr", config.lr),
        local_epochs=config.local_epochs,
        local_steps=config.local_steps,
        optimizer=config.client_optimizer,
        momentum=values.get("momentum", config.momentum),
        weight_decay=config.weight_decay,
        weight_decay_on=config.weight_decay_on,
        dense_layers=model.dense_layers,
        low_rank=config.low_rank,
        factored=model.factored,
        train_apply=model.train_apply,
        collections=model.collections,
    )


def hyperparams(config: RunConfig, model: ModelSpec,
                values: Optional[Mapping[str, Any]] = None, privacy=None) -> Hyperparams:
    """What the config's algorithm runs with (`base.Hyperparams`): the config's values, or
    `values` (by flat key: a sweep member's traced settings) in their place; `privacy`: the
    run's `mcfl.privacy.plan.PrivacyPlan` (DP's clipping norm and noise), if any."""
    values = values or {}
    fields = settings.fields_of(type(config.params))
    own = {fields[k].name: v for k, v in values.items() if k in fields}
    params = dataclasses.replace(config.params, **own) if own else config.params
    dropout = values.get("client_dropout", config.client_dropout)
    return Hyperparams(local_training(config, model, values), params,
                       values.get("shift_prob", config.shift_prob),
                       None if privacy is None else privacy.settings(values),
                       0.0 if dropout is None else dropout)


def context_of(config: RunConfig, model: ModelSpec, clients_per_round: int,
               block_size: Optional[int] = None) -> AlgorithmContext:
    """What every algorithm is built from, as the config says; `block_size`: the plan's
    (`mcfl.runs.execution.RunPlan.train_block`)."""
    return AlgorithmContext(model, clients_per_round, config.clusters if config.clustered else 1,
                            config.client_store_dtype, block_size, system_model(config))


def build_algorithm(config: RunConfig, model: ModelSpec, clients_per_round: int,
                    block_size: Optional[int] = None) -> FederatedAlgorithm:
    """The config's algorithm, trained on data that shifts if the config asks for it, on the
    clients its schedule names. Built once; its hyperparameters come with each call
    (`hyperparams`)."""
    spec = get(config.algorithm)
    context = context_of(config, model, clients_per_round, block_size)
    algorithm = spec.build(context)
    if spec.asynchronous:  # its server steps come from the clock (mcfl.system.events)
        return algorithm
    if config.bn == "local":
        algorithm = with_local_norm(algorithm, model.collections, config.algorithm)
    shifted = with_shift(algorithm, config.shift, config.shift_interval)
    if config.client_sampling == "poisson":
        sampled = with_poisson_sampling(shifted, config.clients_per_round)
    else:
        sampled = with_schedule(shifted, config.client_sampling, clients_per_round)
    if context.system is None:
        return sampled
    return with_system(sampled, context.system, config.clients_per_round,
                       model_megabytes(jax.eval_shape(model.init, jax.random.key(0))))
