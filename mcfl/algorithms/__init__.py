"""The algorithms, each registered under its name (`mcfl.algorithms.registry`), and the parts
every algorithm is built from. A run's plan (`mcfl.runs.plan.Plan.build_algorithm`) builds
its algorithm with the wrappers it needs (a schedule, a shift, Poisson sampling, the clock)."""
# ruff: noqa: I001  (the algorithm imports are in registration order, which is the CLI's order)

from __future__ import annotations


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
from mcfl.algorithms.base import (
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
from mcfl.algorithms.device import DeviceState, OnDevice, on_device, scan_rounds
from mcfl.algorithms.registry import AlgorithmContext, AlgorithmSpec, build, get, names, register


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
