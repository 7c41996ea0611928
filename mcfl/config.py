"""Run configuration: one frozen dataclass holding every hyperparameter of a run.

A run is a pure function of (RunConfig, seed): the config fixes every shape, the seed every
random draw. Configs load from JSON or TOML files (keys are the field names below); unknown keys
and out-of-range values raise `ConfigError` naming the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional, Union

import tomllib

from mcfl.errors import ConfigError, choice_error

ALGORITHMS = ("fedavg", "fedprox", "fedsgd", "local", "fesem", "ifca", "cfl", "fedgroup",
              "flexcfl")
CLUSTERED = ("fesem", "ifca", "cfl", "fedgroup", "flexcfl")
MIGRATIONS = ("label", "counts")
MEASURES = ("edc", "madc")
SHIFTS = ("none", "swap_all", "swap_part", "incremental")
DATASETS = ("synthetic", "mnist5k", "mnist", "fmnist", "digits", "leaf", "tfds:NAME")
TFDS_NAMES = ("mnist", "fashion_mnist", "emnist", "cifar10", "celeb_a")
NORMALIZATIONS = ("scale", "standardize", "none")
OPTIMIZERS = ("sgd", "momentum", "adam")
MODELS = ("mclr", "mlp", "cnn-fmnist", "cnn-leaf")
LOW_RANK = ("auto", "on", "off")
CONVS = ("auto", "matmul", "xla")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every setting of a run. Defaults follow FlexCFL's setup (B = 10, 20 clients a round)."""

    algorithm: str = "fedavg"
    dataset: str = "synthetic"
    clients: int = 100
    rounds: int = 50
    seed: int = 0
    data_seed: Optional[int] = None  # None: same as seed
    data_dir: Optional[str] = None  # where file-based datasets live
    download: bool = False  # let tensorflow-datasets download (never by default)
    # "iid", "dirichlet:0.5", "shards:2", "fedprox-mnist", "ditto-fmnist", "rotated:4", ...;
    # None: natural users for synthetic and leaf, iid otherwise
    partition: Optional[str] = None
    test_fraction: Optional[float] = None  # None: the recipe's (0.1 FedProx, 1/7 Ditto, else 0.2)
    normalize: Optional[str] = None  # scale | standardize | none; None: the recipe's
    # Synthetic(alpha, beta) (FedProx generator)
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    # model
    model: str = "mclr"
    hidden: tuple[int, ...] = (200, 200)
    # CNN convolutions: matmul (shifted views, fast on CPU), xla (flax Conv), auto (by backend)
    conv: str = "auto"
    # client training
    lr: float = 0.01
    batch_size: int = 10
    local_epochs: int = 1
    local_steps: Optional[int] = None  # a fixed number of steps instead of epochs
    client_optimizer: str = "sgd"
    momentum: float = 0.9  # used by client_optimizer = "momentum"
    weight_decay: float = 0.0
    mu: Optional[float] = None  # FedProx proximal weight; None: 0.01 (the authors' code)
    # server
    # a count (int) or a fraction (float); None: min(20, clients)
    clients_per_round: Optional[Union[int, float]] = None
    server_lr: float = 1.0
    # clustered algorithms
    clusters: int = 4  # K: centers (FeSEM), models (IFCA), most clusters (CFL)
    fesem_lambda: float = 0.05  # lambda of FeSEM Eq. 6 (proximal weight 2*lambda*n_bar/n_i)
    fesem_restarts: int = 20  # k-means restarts of FeSEM's initialisation (paper Sec. 6.1)
    fesem_last_layer: bool = False  # cluster on the last dense kernel (the authors' code)
    fesem_weighted: bool = False  # M-step weighted by n_i instead of Eq. 10's plain mean
    cfl_eps1: float = 0.4  # CFL: split when the mean update norm is below eps1 ...
    cfl_eps2: float = 1.6  # ... and the largest member update norm above eps2
    cfl_warmup: int = 20  # CFL: rounds before the first split
    pretrain_scale: int = 20  # FedGroup: alpha, so alpha * K clients take part in the cold start
    measure: str = "edc"  # FedGroup grouping: edc (+ k-means++) or madc (+ complete linkage)
    eta_g: float = 0.0  # FedGroup inter-group aggregation rate
    migration: str = "label"  # FlexCFL's shift test: label-aware, or the authors' "counts"
    # client-level distribution shift, for any algorithm (mcfl.shift)
    shift: str = "none"  # none | swap_all | swap_part | incremental
    shift_prob: float = 0.05  # swap_all / swap_part: chance of a swap each round
    shift_interval: int = 50  # incremental: rounds between releases of 25% more data
    # execution and evaluation
    eval_every: int = 1
    # Run the rounds between evaluations as one lax.scan on the device (rows arrive per chunk)
    scan_rounds: bool = False
    block_size: Optional[int] = None  # None: chosen from the model size and backend
    # Train dense models with factored weight changes (mcfl.lowrank): auto = when it is faster
    low_rank: str = "auto"
    devices: Optional[int] = None  # local devices the clients are sharded over; None: all

    def __post_init__(self):
        _validate(self)

    def replace(self, **changes) -> RunConfig:
        return from_dict({**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["hidden"] = list(self.hidden)
        return out

    @property
    def effective_mu(self) -> float:
        if self.algorithm == "fedprox":
            return 0.01 if self.mu is None else self.mu
        return 0.0


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}


def _validate(c: RunConfig) -> None:
    if c.algorithm not in ALGORITHMS:
        raise choice_error("algorithm", c.algorithm, ALGORITHMS)
    _validate_data(c)
    if c.model not in MODELS:
        raise choice_error("model", c.model, MODELS)
    if c.client_optimizer not in OPTIMIZERS:
        raise choice_error("client_optimizer", c.client_optimizer, OPTIMIZERS)
    if c.conv not in CONVS:
        raise choice_error("conv", c.conv, CONVS)
    if c.low_rank not in LOW_RANK:
        raise choice_error("low_rank", c.low_rank, LOW_RANK)
    if c.low_rank == "on" and (c.client_optimizer != "sgd" or c.weight_decay != 0):
        raise ConfigError(
            "low_rank=on needs plain SGD (client_optimizer=sgd, weight_decay=0); got "
            f"client_optimizer={c.client_optimizer}, weight_decay={c.weight_decay}"
        )
    for name in ("clients", "rounds", "batch_size", "local_epochs", "eval_every"):
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    for name in ("local_steps", "block_size", "devices"):
        value = getattr(c, name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name} must be an integer >= 1 (or unset), got {value!r}")
    if isinstance(c.clusters, bool) or not isinstance(c.clusters, int) or c.clusters < 1:
        raise ConfigError(f"clusters must be an integer >= 1, got {c.clusters!r}")
    if c.algorithm in CLUSTERED and c.clusters > c.clients:
        raise ConfigError(
            f"clusters (K = {c.clusters}) cannot exceed the number of clients ({c.clients})"
        )
    if c.fesem_lambda < 0:
        raise ConfigError(f"fesem_lambda must be >= 0, got {c.fesem_lambda}")
    if not isinstance(c.fesem_restarts, int) or c.fesem_restarts < 1:
        raise ConfigError(f"fesem_restarts must be an integer >= 1, got {c.fesem_restarts!r}")
    if not 0 <= c.cfl_eps1 <= c.cfl_eps2:
        raise ConfigError(
            f"CFL needs 0 <= eps1 <= eps2, got eps1={c.cfl_eps1}, eps2={c.cfl_eps2}"
        )
    if not isinstance(c.cfl_warmup, int) or c.cfl_warmup < 0:
        raise ConfigError(f"cfl_warmup must be an integer >= 0, got {c.cfl_warmup!r}")
    if c.shift not in SHIFTS:
        raise choice_error("shift", c.shift, SHIFTS)
    if not 0.0 <= c.shift_prob <= 1.0:
        raise ConfigError(f"shift_prob must be in [0, 1], got {c.shift_prob}")
    if not isinstance(c.shift_interval, int) or c.shift_interval < 1:
        raise ConfigError(f"shift_interval must be an integer >= 1, got {c.shift_interval!r}")
    if c.migration not in MIGRATIONS:
        raise choice_error("migration", c.migration, MIGRATIONS)
    if c.measure not in MEASURES:
        raise choice_error("measure", c.measure, MEASURES)
    if c.eta_g < 0:
        raise ConfigError(f"eta_g must be >= 0, got {c.eta_g}")
    if not isinstance(c.pretrain_scale, int) or c.pretrain_scale < 1:
        raise ConfigError(f"pretrain_scale must be an integer >= 1, got {c.pretrain_scale!r}")
    if c.algorithm in ("fedgroup", "flexcfl") and c.pretrain_scale * c.clusters > c.clients:
        raise ConfigError(
            f"the group cold start needs pretrain_scale * clusters = {c.pretrain_scale} * "
            f"{c.clusters} = {c.pretrain_scale * c.clusters} clients, more than the "
            f"{c.clients} clients; lower --pretrain-scale or --clusters"
        )
    if not c.lr > 0:
        raise ConfigError(f"lr must be > 0, got {c.lr}")
    if not c.server_lr > 0:
        raise ConfigError(f"server_lr must be > 0, got {c.server_lr}")
    if c.weight_decay < 0:
        raise ConfigError(f"weight_decay must be >= 0, got {c.weight_decay}")
    if not 0 <= c.momentum < 1:
        raise ConfigError(f"momentum must be in [0, 1), got {c.momentum}")
    if c.mu is not None:
        if c.mu < 0:
            raise ConfigError(f"mu must be >= 0, got {c.mu}")
        if c.algorithm != "fedprox" and c.mu > 0:
            raise ConfigError(f"mu applies to algorithm 'fedprox' only, not {c.algorithm!r}")
    if c.test_fraction is not None and not 0 < c.test_fraction < 1:
        raise ConfigError(f"test_fraction must be in (0, 1), got {c.test_fraction}")
    if c.synthetic_alpha < 0 or c.synthetic_beta < 0:
        raise ConfigError(
            f"synthetic alpha and beta must be >= 0, got {c.synthetic_alpha}, {c.synthetic_beta}"
        )
    if not c.hidden or any(not isinstance(h, int) or h < 1 for h in c.hidden):
        raise ConfigError(f"hidden widths must be positive integers, got {c.hidden!r}")
    from mcfl.sampling import resolve_clients_per_round

    resolve_clients_per_round(c.clients_per_round, c.clients)


def _validate_data(c: RunConfig) -> None:
    if c.dataset.startswith("tfds:"):
        base = c.dataset[len("tfds:"):].split("/")[0]
        if base not in TFDS_NAMES:
            raise choice_error("tfds dataset", base, TFDS_NAMES)
    elif c.dataset not in DATASETS:
        raise choice_error("dataset", c.dataset, DATASETS)
    if c.normalize is not None and c.normalize not in NORMALIZATIONS:
        raise choice_error("normalize", c.normalize, NORMALIZATIONS)
    from mcfl.data.spec import parse_partition

    if c.partition is not None:
        part = parse_partition(c.partition)
        natural_only = c.dataset in ("synthetic", "leaf")
        if natural_only and (part.kind != "natural" or part.planted):
            raise ConfigError(
                f"dataset {c.dataset!r} comes split by its own users: its partition is "
                f"'natural', not {c.partition!r}"
            )
        if not natural_only and part.kind == "natural":
            raise ConfigError(
                f"partition 'natural' needs per-user data (dataset synthetic or leaf), "
                f"not {c.dataset!r}"
            )
    if c.dataset == "leaf" and c.test_fraction is not None:
        raise ConfigError("leaf data brings its own test files; test_fraction does not apply")


def from_dict(values: dict[str, Any]) -> RunConfig:
    """A RunConfig from a mapping of field names (e.g. a parsed config file)."""
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(FIELDS)}"
        )
    values = dict(values)
    if "hidden" in values:
        values["hidden"] = parse_hidden(values["hidden"])
    return RunConfig(**values)


def parse_hidden(value) -> tuple[int, ...]:
    """'200,200' or [200, 200] -> (200, 200)."""
    try:
        if isinstance(value, str):
            return tuple(int(v) for v in value.split(",") if v.strip())
        return tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"hidden must be comma-separated integers like 200,200, got {value!r}"
        ) from None


def load_file(path: Union[str, Path]) -> dict[str, Any]:
    """Read a JSON or TOML config file into a dict (not yet validated)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        if path.suffix == ".toml":
            return tomllib.loads(path.read_text())
        if path.suffix == ".json":
            return json.loads(path.read_text())
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"config file {str(path)!r} is malformed: {e}") from None
    raise ConfigError(f"config file {str(path)!r} must end in .json or .toml")
