"""Run configuration: the shared settings of a run plus the algorithm's own hyperparameters.

A run is a pure function of (RunConfig, seed): the config fixes every shape, the seed every
random draw. Every setting is typed and documented (`mcfl.settings`); the algorithm's own
hyperparameters are its registered dataclass (`mcfl.algorithms.registry`), reached as
``config.params`` and, flat, by their keys (``config.fesem_lambda``). Configs load from JSON or
TOML files whose keys are the flat keys; unknown keys, values of the wrong type or out of range,
and hyperparameters of another algorithm raise `ConfigError` naming the key, the value and what
is allowed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Annotated, Any, Optional, Union

import tomllib

from mcfl.errors import ConfigError, choice_error
from mcfl.settings import INT64_MAX, Static, setting

SHIFTS = ("none", "swap_all", "swap_part", "incremental")
DATASETS = ("synthetic", "mnist5k", "mnist", "fmnist", "digits", "leaf", "tfds:NAME")
TFDS_NAMES = ("mnist", "fashion_mnist", "emnist", "cifar10", "celeb_a")
NORMALIZATIONS = ("scale", "standardize", "none")
OPTIMIZERS = ("sgd", "momentum", "adam")
MODELS = ("mclr", "mlp", "cnn-fmnist", "cnn-leaf", "cnn-celeba")
LOW_RANK = ("auto", "on", "off")
CONVS = ("auto", "matmul", "xla")
SCORES = ("mcfl", "paper")
CLIENT_SAMPLINGS = ("random", "round_robin_first")  # as mcfl.schedule.SCHEDULES
DEFAULT_CLIENTS = 100


def _registry():
    """The algorithm registry, populated (importing the algorithms imports JAX: done lazily)."""
    import mcfl.algorithms  # noqa: F401  (registers every algorithm)
    from mcfl.algorithms import registry

    return registry


def algorithm_names() -> tuple[str, ...]:
    return _registry().names()


@dataclasses.dataclass(frozen=True, init=False)
class RunConfig:
    """Every setting of a run. Defaults follow FlexCFL's setup (B = 10, 20 clients a round).

    ``RunConfig(algorithm="fesem", fesem_lambda=0.1, clients=200)``: shared settings by name,
    the algorithm's hyperparameters by their flat keys (or ``params=`` its dataclass).
    """

    algorithm: str = setting("fedavg", "the algorithm (see the table in the README)")
    dataset: str = setting("synthetic", "synthetic | mnist5k | mnist | fmnist | digits | leaf | "
                           "tfds:NAME")
    clients: Optional[int] = setting(None, "number of clients (default: all the users of a "
                                     "natural dataset (leaf), else 100)", minimum=1)
    rounds: int = setting(50, "communication rounds", minimum=1)
    seed: int = setting(0, "seed of the run (initial model, sampling, shuffles)", minimum=0,
                        maximum=INT64_MAX)
    data_seed: Optional[int] = setting(None, "seed of the dataset (default: --seed)", minimum=0,
                                       maximum=INT64_MAX)
    data_dir: Optional[str] = setting(None, "folder holding the dataset's files")
    download: bool = setting(False, "let tensorflow-datasets download the data (never by "
                             "default)")
    partition: Optional[str] = setting(
        None, "iid | dirichlet:ALPHA | shards:C | fedprox-mnist | ditto-fmnist | natural | "
        "rotated:R | permuted:R (joinable: rotated:4+dirichlet:0.5); default: natural for "
        "synthetic and leaf, else iid")
    samples_per_client: Optional[int] = setting(
        None, "split datasets: keep at most this many rows (train + test) of each client, "
        "drawn at random (IFCA's n); default all", minimum=1)
    test_fraction: Optional[float] = setting(
        None, "per-client test share (default: the recipe's: 0.1 FedProx, 1/7 Ditto, else 0.2; "
        "leaf: its own test files, unless given: then each user's rows are split again)",
        above=0, below=1)
    normalize: Optional[str] = setting(None, "scale | standardize | none (default: the "
                                       "partition recipe's)", choices=NORMALIZATIONS)
    synthetic_alpha: float = setting(1.0, "Synthetic(alpha, beta): how much local models "
                                     "differ", minimum=0)
    synthetic_beta: float = setting(1.0, "Synthetic(alpha, beta): how much local inputs differ",
                                    minimum=0)
    model: str = setting("mclr", "mclr | mlp | cnn-fmnist | cnn-leaf | cnn-celeba",
                         choices=MODELS)
    hidden: tuple[int, ...] = setting((200, 200), "MLP hidden widths, e.g. 200,200")
    conv: str = setting("auto", "CNN convolutions: matmul (shifted views and one matmul, fast on "
                        "CPU) | xla (flax Conv) | auto (matmul on CPU, xla on GPU / TPU)",
                        choices=CONVS)
    lr: float = setting(0.01, "client learning rate (FedSGD: the server's)", above=0)
    batch_size: int = setting(10, "local mini-batch size B", minimum=1)
    local_epochs: int = setting(1, "local epochs E (each ceil(n_i/B) steps)", minimum=1)
    local_steps: Optional[int] = setting(None, "a fixed number of local steps instead of "
                                         "epochs", minimum=1)
    client_optimizer: str = setting("sgd", "sgd | momentum | adam", choices=OPTIMIZERS)
    momentum: float = setting(0.9, "momentum of --client-optimizer momentum", minimum=0,
                              below=1)
    weight_decay: Annotated[float, Static("0 or not picks the training path: the factored "
                                          "fast paths need plain SGD")] = setting(
        0.0, "L2 weight decay on the clients", minimum=0)
    clients_per_round: Optional[Union[int, float]] = setting(
        None, "clients sampled per round: a count (20) or a fraction (0.1); default "
        "min(20, clients)")
    client_sampling: str = setting(
        "random", "which clients train each round: random (S distinct at random) | "
        "round_robin_first (the first ceil(C/S) rounds go through every client once, in a "
        "random order, then random: the FlexCFL authors' code)", choices=CLIENT_SAMPLINGS)
    clusters: int = setting(4, "K: FeSEM centers, IFCA models, FedGroup groups, CFL's most "
                            "clusters (clustered algorithms)", minimum=1)
    shift: str = setting("none", "client-level distribution shift: none | swap_all | swap_part "
                         "| incremental", choices=SHIFTS)
    shift_prob: float = setting(0.05, "chance of a swap each round (swap_all, swap_part)",
                                minimum=0, maximum=1)
    shift_interval: int = setting(50, "incremental: rounds between releases of 25% more "
                                  "training data", minimum=1)
    eval_every: int = setting(1, "evaluate every N rounds (and after the last)", minimum=1)
    score: str = setting("mcfl", "the 'best' accuracy printed and compared: mcfl (the best "
                         "evaluated round) | paper (FlexCFL's rule: only rounds with every "
                         "client in a group count); summary.json has both", choices=SCORES)
    scan_rounds: bool = setting(False, "run the rounds between evaluations as one lax.scan on "
                                "the device, with no host round-trip per round (per-round "
                                "rows arrive at each evaluation)")
    block_size: Optional[int] = setting(None, "clients per vmapped block (default: from model "
                                        "size and backend)", minimum=1)
    low_rank: str = setting("auto", "train dense layers with factored weight changes "
                            "(mcfl.engine.lowrank): auto (when faster) | on | off",
                            choices=LOW_RANK)
    devices: Optional[int] = setting(None, "devices the clients are sharded over (default: "
                                     "all)", minimum=1)
    embed_clients: int = setting(1000, "clustered runs: after the last round, this many clients "
                                 "(all if fewer) train once from their cluster's model, and "
                                 "their models' 2-D PCA projection is kept (clients_pca.npz, "
                                 "mcfl plot clusters); 0: none", minimum=0)
    params: Any = dataclasses.field(default=None, metadata={"doc": "", "internal": True})

    def __init__(self, **values):
        from mcfl.settings import check

        params = values.pop("params", None)
        algorithm = values.get("algorithm", "fedavg")
        if not isinstance(algorithm, str):
            raise ConfigError(f"algorithm must be a string, got {algorithm!r}")
        registry = _registry()
        spec = registry.get(algorithm)
        for f in SHARED_FIELDS.values():
            value = values.pop(f.name) if f.name in values else f.default
            object.__setattr__(self, f.name, check(RunConfig, f, value))
        if self.clients is None and self.dataset != "leaf":
            # Only a natural dataset knows its users; the others are split over 100 clients.
            object.__setattr__(self, "clients", DEFAULT_CLIENTS)
        if self.data_dir is not None:  # "~/data" in a config file means what a shell means
            object.__setattr__(self, "data_dir", os.path.expanduser(self.data_dir))
        if params is not None:
            if not isinstance(params, spec.params):
                raise ConfigError(f"params for {algorithm!r} must be a "
                                  f"{spec.params.__name__}, got {type(params).__name__}")
            params = registry.with_values(spec.params, params, values)
        else:
            params = registry.params_from_flat(algorithm, values)
        object.__setattr__(self, "params", params)
        _validate(self)

    def __getattr__(self, name: str):
        """The algorithm's hyperparameters by flat key or field name (``config.mu``)."""
        if name.startswith("__") or name == "params":
            raise AttributeError(name)
        from mcfl import settings

        params = object.__getattribute__(self, "params")
        for f in dataclasses.fields(params):
            if name in (f.name, settings.key_of(f)):
                return getattr(params, f.name)
        raise AttributeError(f"{self.algorithm!r} has no setting or hyperparameter {name!r}")

    def replace(self, **changes) -> RunConfig:
        """A new config with `changes` (flat keys). Changing the algorithm keeps the
        hyperparameters the new one shares with the old (same key) and drops the others."""
        values = self.to_dict()
        new = changes.get("algorithm", self.algorithm)
        if new != self.algorithm:
            from mcfl import settings

            keep = settings.fields_of(_registry().get(new).params)
            for key in settings.as_flat(self.params):
                if key not in keep:
                    values.pop(key)
        return from_dict({**values, **changes})

    def to_dict(self) -> dict[str, Any]:
        """Every setting by flat key, the algorithm's hyperparameters included (the form of
        config files and of summary.json's "config")."""
        from mcfl import settings

        out = {name: getattr(self, name) for name in SHARED_FIELDS}
        out["hidden"] = list(self.hidden)
        out.update(settings.as_flat(self.params))
        return out

    @property
    def clustered(self) -> bool:
        return _registry().get(self.algorithm).clustered


SHARED_FIELDS = {f.name: f for f in dataclasses.fields(RunConfig) if f.name != "params"}


def all_keys() -> dict[str, Any]:
    """Every flat key a config can hold: the shared settings, then every algorithm's
    hyperparameters (a key shared by several algorithms once)."""
    return {**SHARED_FIELDS, **{k: None for k in _registry().owners_of_keys()}}


def _validate(c: RunConfig) -> None:
    _validate_data(c)
    if c.low_rank == "on" and (c.client_optimizer != "sgd" or c.weight_decay != 0):
        raise ConfigError(
            "low_rank=on needs plain SGD (client_optimizer=sgd, weight_decay=0); got "
            f"client_optimizer={c.client_optimizer}, weight_decay={c.weight_decay}"
        )
    if c.clients is None:  # a natural dataset's users, counted when it is loaded
        return
    if c.clustered and c.clusters > c.clients:
        raise ConfigError(
            f"clusters (K = {c.clusters}) cannot exceed the number of clients ({c.clients})"
        )
    check = getattr(c.params, "check", None)
    if check is not None:  # an algorithm's checks across settings
        check(c)
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
    if c.samples_per_client is not None and c.dataset in ("synthetic", "leaf"):
        raise ConfigError(f"samples_per_client applies to datasets split over clients, not "
                          f"{c.dataset!r} (its users bring their own rows)")


def from_dict(values: dict[str, Any]) -> RunConfig:
    """A RunConfig from a mapping of flat keys (e.g. a parsed config file)."""
    if not isinstance(values, dict):
        raise ConfigError(f"a config must be a mapping of keys to values, got "
                          f"{type(values).__name__}")
    unknown = sorted(set(values) - set(all_keys()))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(map(repr, unknown))}; allowed: "
            f"{', '.join(all_keys())}"
        )
    values = dict(values)
    if "hidden" in values and isinstance(values["hidden"], str):
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
    if path.suffix not in (".toml", ".json"):
        raise ConfigError(f"config file {str(path)!r} must end in .json or .toml")
    try:
        text = path.read_text()
        values = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {str(path)!r} is malformed: {e}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys to values, "
                          f"got a {type(values).__name__}")
    return values
