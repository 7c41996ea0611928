"""The algorithms, each registered under its name (`framework.registry`), laid out by what
they are:

* `framework`: what every algorithm is (`base`: six pure functions over a state pytree), the
  registry, the round skeleton written once, the algorithm run on the device and the rows a
  client store keeps (`device`, `stored`);
* `wrappers`: what a run's plan (`mcfl.runs.plan.Plan.build_algorithm`) wraps any algorithm
  with: a client schedule, a distribution shift, FedBN's local layers, Poisson sampling, the
  clock (`system_rounds`);
* `global_model`: one model for every client (FedAvg, FedProx, FedSGD, FedDist, FedDANE,
  SCAFFOLD, FedNova);
* `personalised`: a model of each client's own (Local, FedPer, LG-FedAvg, Ditto, APFL,
  Per-FedAvg, pFedMe, FedRep);
* `clustered`: K models, each client served by its cluster's or a mixture (FeSEM and its
  variants, IFCA, FedEM, FedSoft, FedRC, StoCFL, CFL, CFL-GP, FLUX, FedGWC, Robust, FL+HC,
  PACFL, FedGroup / FlexCFL), with their `shared` pieces;
* `asynchronous`: servers that step on the simulated clock as clients arrive (FedBuff,
  FedAsync, IFCA-async).
"""
# ruff: noqa: I001  (the algorithm imports are in registration order, which is the CLI's order)

from __future__ import annotations


# Importing a module registers its algorithms; this order is the order of the CLI's choices
# and of the README's table.
from mcfl.algorithms.global_model import fedavg as _fedavg  # noqa: F401
from mcfl.algorithms.global_model import fedsgd as _fedsgd  # noqa: F401
from mcfl.algorithms.personalised import local as _local  # noqa: F401
from mcfl.algorithms.personalised import partial as _partial  # noqa: F401
from mcfl.algorithms.personalised import ditto as _ditto  # noqa: F401
from mcfl.algorithms.personalised import apfl as _apfl  # noqa: F401
from mcfl.algorithms.personalised import perfedavg as _perfedavg  # noqa: F401
from mcfl.algorithms.personalised import pfedme as _pfedme  # noqa: F401
from mcfl.algorithms.personalised import fedrep as _fedrep  # noqa: F401
from mcfl.algorithms.global_model import feddist as _feddist  # noqa: F401
from mcfl.algorithms.global_model import feddane as _feddane  # noqa: F401
from mcfl.algorithms.global_model import scaffold as _scaffold  # noqa: F401
from mcfl.algorithms.global_model import fednova as _fednova  # noqa: F401
from mcfl.algorithms.clustered import fesem as _fesem  # noqa: F401
from mcfl.algorithms.clustered import fesem_ma as _fesem_ma  # noqa: F401
from mcfl.algorithms.clustered import dp_fesem as _dp_fesem  # noqa: F401
from mcfl.algorithms.clustered import ifca as _ifca  # noqa: F401
from mcfl.algorithms.clustered import fedem as _fedem  # noqa: F401
from mcfl.algorithms.clustered import fedsoft as _fedsoft  # noqa: F401
from mcfl.algorithms.clustered import fedrc as _fedrc  # noqa: F401
from mcfl.algorithms.clustered import stocfl as _stocfl  # noqa: F401
from mcfl.algorithms.clustered import cfl as _cfl  # noqa: F401
from mcfl.algorithms.clustered import cflgp as _cflgp  # noqa: F401
from mcfl.algorithms.clustered import flux as _flux  # noqa: F401
from mcfl.algorithms.clustered import fedgwc as _fedgwc  # noqa: F401
from mcfl.algorithms.clustered import robust as _robust  # noqa: F401
from mcfl.algorithms.clustered import flhc as _flhc  # noqa: F401
from mcfl.algorithms.clustered import pacfl as _pacfl  # noqa: F401
from mcfl.algorithms.clustered import fedgroup as _fedgroup  # noqa: F401
from mcfl.algorithms.asynchronous import servers as _asynchronous  # noqa: F401
from mcfl.algorithms.framework.base import (
    ClientModels,
    ClientState,
    Exchange,
    FederatedAlgorithm,
    Hyperparams,
    PerClientModels,
    PopulationStart,
    RowModels,
    SharedModels,
)
from mcfl.algorithms.framework.device import DeviceState, OnDevice, on_device, scan_rounds
from mcfl.algorithms.framework.registry import (
    AlgorithmContext,
    AlgorithmSpec,
    build,
    get,
    names,
    register,
)


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
    "PerClientModels",
    "PopulationStart",
    "RowModels",
    "SharedModels",
    "build",
    "get",
    "names",
    "on_device",
    "register",
    "scan_rounds",
]
