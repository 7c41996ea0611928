"""Run configuration: the settings of a run, grouped by concern, plus the algorithm's own
hyperparameters.

A run is a pure function of (RunConfig, seed): the config fixes every shape, the seed every
random draw. `RunConfig` holds the run itself (algorithm, rounds, seed, K) and one frozen
group per concern: `data`, `network` (the model), `training` (local training), `sampling`,
`distribution_shift`, `evaluation` and `execution`; the algorithm's hyperparameters are its
registered dataclass (`mcfl.algorithms.framework.registry`), ``config.params``. Every setting is
typed and documented (`mcfl.settings`) and has a *flat key*, its name in config files, flags
(``--local-epochs``) and Python: ``RunConfig(lr=0.05, mu=1.0)``, ``config.lr``,
``config.replace(lr=0.1)`` and ``config.to_dict()`` all speak flat keys, whatever group holds
them. Unknown keys, values of the wrong type or out of range, and hyperparameters of another
algorithm raise `ConfigError` naming the key, the value and what is allowed. A config is what
the user said; what it means together (a setting that does not apply, settings that
contradict each other) is checked when it is resolved into what will run
(`mcfl.runs.plan.resolve`), the one place below which nothing reads a config.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Annotated, Any, Optional, Union

import tomllib

from mcfl import settings
from mcfl.algorithms.framework import registry
from mcfl.data.settings import DataSettings, check_data, counts_own_clients, default_clients
from mcfl.errors import ConfigError
from mcfl.models.build import check_model_name
from mcfl.settings import INT64_MAX, Static, setting
from mcfl.system.devices import DEADLINE_POLICIES

SHIFTS = ("none", "swap_all", "swap_part", "incremental")
OPTIMIZERS = ("sgd", "momentum", "adam")  # as mcfl.engine.training.OPTIMIZERS
NORM_STATES = ("global", "local")
FAST_PATHS = ("auto", "off")
LOW_RANK = ("auto", "on", "off")
SCAN_ROUNDS = ("auto", "on", "off")
CONVS = ("auto", "matmul", "xla")
PRECISIONS = ("float32", "bfloat16")  # as mcfl.models.precision.PRECISIONS
CLIENT_STORES = ("auto", "device", "host", "disk")
STORE_DTYPES = ("float32", "bfloat16")
SCORES = ("mcfl", "paper")
# as mcfl.algorithms.wrappers.schedule.SCHEDULES, and poisson (mcfl.privacy.sampling)
CLIENT_SAMPLINGS = ("random", "round_robin_first", "poisson")
ACCOUNTANTS = ("rdp", "pld")  # as mcfl.privacy.accounting.ACCOUNTANTS
DECAYED = ("all", "kernels")  # as mcfl.engine.training.DECAYED


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The network every client trains."""

    model: str = setting("mclr", "a registered model (mclr, mlp, cnn-fmnist, cnn-leaf, "
                         "cnn-celeba, the zoo: mcfl models lists them) or a factory's import path "
                         "module.path:Factory")
    model_args: dict = setting({}, "keyword arguments of the model's factory, a JSON object "
                               "(e.g. {\"width\": 32})")
    hidden: tuple[int, ...] = setting((200, 200), "MLP hidden widths, e.g. 200,200")
    bn: str = setting("global", "batch-norm statistics and layers: global (aggregated with the "
                      "parameters) | local (kept by each client: FedBN)", choices=NORM_STATES)


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """What a client does in a round (`mcfl.engine.LocalTraining`)."""

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
        0.0, "L2 weight decay on the clients (wd * W added to each step's gradient)",
        minimum=0)
    weight_decay_on: str = setting("all", "what --weight-decay decays: all (every parameter) | "
                                   "kernels (dense and conv kernels, not biases or norm "
                                   "scales: the FlexCFL authors' L2, e.g. their mclr.py; "
                                   "Keras's l2(c) is --weight-decay 2c)", choices=DECAYED)
    client_store_dtype: str = setting("float32", "what clients keep between rounds (Local's "
                                      "and personal models, control variates; FeSEM's and "
                                      "Robust's start) is stored as float32 or bfloat16 (half "
                                      "the memory; training stays float32)",
                                      choices=STORE_DTYPES)


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """Which clients train each round."""

    clients_per_round: Optional[Union[int, float]] = setting(
        None, "clients sampled per round: a count (20) or a fraction (0.1); default "
        "min(20, clients)")
    client_sampling: str = setting(
        "random", "which clients train each round: random (S distinct at random) | "
        "round_robin_first (the first ceil(C/S) rounds go through every client once, in a "
        "random order, then random: the FlexCFL authors' code) | poisson (each client joins "
        "with probability q = S / C, as DP's amplification by sampling assumes)",
        choices=CLIENT_SAMPLINGS)


@dataclasses.dataclass(frozen=True)
class PrivacySettings:
    """Client-level differential privacy (DP-FedAvg, `mcfl.privacy`): on when --dp-clip is
    given."""

    dp_clip: Optional[float] = setting(
        None, "C: each client's update is clipped to this L2 norm and the server adds "
        "Gaussian noise to every aggregated sum (client-level DP, DP-FedAvg); the starting C "
        "with --dp-adaptive-quantile", above=0)
    dp_noise: Optional[float] = setting(
        None, "z, the noise multiplier: noise std z * C on each sum of clipped updates (give "
        "it or --dp-epsilon)", minimum=0)
    dp_epsilon: Optional[float] = setting(
        None, "the epsilon the whole run may spend: z is solved for the run's rounds and "
        "sampling (instead of --dp-noise)", above=0)
    dp_delta: Optional[float] = setting(
        None, "delta of the (epsilon, delta) guarantee; default 1 / C^1.1 (below 1 / C)",
        above=0, below=1)
    dp_epsilon_budget: Optional[float] = setting(
        None, "stop the run after the last round whose epsilon stays within this budget",
        above=0)
    dp_adaptive_quantile: Optional[float] = setting(
        None, "adaptive clipping (Andrew et al. 2021): C follows this quantile of the "
        "clients' update norms, its noised count accounted", above=0, below=1)
    dp_clip_per_layer: bool = setting(False, "clip each of the model's L leaves to C / "
                                      "sqrt(L) instead of the whole update to C")
    dp_accountant: str = setting("rdp", "the accountant (dp-accounting): rdp | pld",
                                 choices=ACCOUNTANTS)
    dp_canaries: int = setting(0, "canary clients for an empirical epsilon (Andrew et al. "
                               "2024): this many random unit updates join every round; "
                               "needs --dp-clip", minimum=0)


@dataclasses.dataclass(frozen=True)
class SystemSettings:
    """Clients as they are (`mcfl.system`): devices on a simulated clock, availability,
    dropouts, deadlines, over-selection. On when any of them is given."""

    device_speeds: Optional[str] = setting(
        None, "each client's compute speed in local steps per simulated second, drawn: "
        "constant:V | uniform:LO,HI | lognormal:MU,SIGMA | pareto:SHAPE,SCALE (default: 1 "
        "step a second once the clock is on)")
    bandwidth: Optional[str] = setting(
        None, "each client's network in MB/s both ways, drawn as --device-speeds (a message "
        "is the model's float32 parameters); default: messages take no time")
    latency: float = setting(0.0, "seconds added to every message", minimum=0)
    device_trace: Optional[str] = setting(
        None, "a CSV or JSON file giving every client's speed, bandwidth, latency and online "
        "intervals (docs: 'Clients as they are'), instead of --device-speeds / --bandwidth")
    availability: str = setting(
        "always", "when clients can be sampled: always | diurnal:PERIOD,ON_FRACTION (online "
        "ON_FRACTION of every PERIOD seconds, phases at random) | trace:PERIOD (the trace's "
        "intervals, repeating every PERIOD seconds)")
    client_dropout: Optional[float] = setting(
        None, "chance P that a sampled client fails before reporting (each round, each "
        "client)", minimum=0, below=1)
    deadline: Optional[float] = setting(
        None, "round deadline in simulated seconds: clients report the steps they finished by "
        "then (or drop: --deadline-policy)", above=0)
    deadline_policy: str = setting("partial", "a client cut by the deadline: partial (reports "
                                   "the steps it finished) | drop", choices=DEADLINE_POLICIES)
    over_select: float = setting(
        0.0, "over-selection (Bonawitz et al. 2019): sample ceil((1 + F) S) clients and keep "
        "the first S to finish", minimum=0, maximum=10)


@dataclasses.dataclass(frozen=True)
class ShiftSettings:
    """Client-level distribution shift (FlexCFL Sec. 5.3), for any algorithm."""

    shift: str = setting("none", "client-level distribution shift: none | swap_all | swap_part "
                         "| incremental", choices=SHIFTS)
    shift_prob: float = setting(0.05, "chance of a swap each round (swap_all, swap_part)",
                                minimum=0, maximum=1)
    shift_interval: int = setting(50, "incremental: rounds between releases of 25% more "
                                  "training data", minimum=1)


@dataclasses.dataclass(frozen=True)
class EvaluationSettings:
    """When a run is scored, how, and what it keeps for plots."""

    eval_every: int = setting(1, "evaluate every N rounds (and after the last)", minimum=1)
    score: str = setting("mcfl", "the 'best' accuracy printed and compared: mcfl (the best "
                         "evaluated round) | paper (FlexCFL's rule: only rounds with every "
                         "client in a group count); summary.json has both", choices=SCORES)
    embed_clients: int = setting(1000, "clustered runs: after the last round, this many clients "
                                 "(all if fewer) train once from their cluster's model, and "
                                 "their models' 2-D PCA projection is kept (clients_pca.npz, "
                                 "mcfl plot clusters); 0: none", minimum=0)


@dataclasses.dataclass(frozen=True)
class ExecutionSettings:
    """How the computation runs: the same numbers whatever these are (to float rounding;
    `precision` bfloat16 rounds to 8 bits of mantissa)."""

    scan_rounds: str = setting("auto", "run the rounds between evaluations as one lax.scan "
                               "on the device, with no host round-trip per round (the same "
                               "rows; they, the progress bar and checkpoints arrive at each "
                               "evaluation): auto (when a round is small, below about 1e9 "
                               "FLOPs, and the client state is on the device) | on | off",
                               choices=SCAN_ROUNDS)
    block_size: Optional[int] = setting(None, "clients per vmapped block (default: from model "
                                        "size and backend)", minimum=1)
    low_rank: str = setting("auto", "train dense layers with factored weight changes "
                            "(mcfl.engine.lowrank): auto (when faster) | on | off",
                            choices=LOW_RANK)
    fast_paths: str = setting("auto", "auto: the factored dense paths and convolution as "
                              "matmul wherever they are exact, also on a user's model | off: "
                              "the generic vmapped path", choices=FAST_PATHS)
    conv: str = setting("auto", "CNN convolutions: matmul (shifted views and one matmul, 20x "
                        "faster on CPU, 1.7x on an H200) | xla (flax Conv) | auto (matmul on "
                        "CPU and GPU, xla on TPU)", choices=CONVS)
    precision: str = setting("float32", "what the model computes in: float32 | bfloat16 "
                             "(its matmuls, convolutions and activations, in training and "
                             "evaluation alike, on float32 master weights; losses, gradients, "
                             "optimizer and all aggregation stay float32; the factored dense "
                             "paths are off; 2x slower on CPU: BENCHMARKS.md)",
                             choices=PRECISIONS)
    devices: Optional[int] = setting(None, "devices the clients are sharded over (default: "
                                     "all)", minimum=1)
    client_store: str = setting("auto", "where clients' kept state (Local's and personal "
                                "models, control variates; FeSEM's and Robust's start) "
                                "lives: device | host (memory) | disk (the run folder, or a "
                                "temporary one) | auto (device if it fits, else host, else "
                                "disk)", choices=CLIENT_STORES)


# The groups of a RunConfig: attribute name -> settings class, in the order flags, config
# files and the docs list them.
GROUPS: dict[str, type] = {
    "data": DataSettings,
    "network": ModelSettings,
    "training": TrainingSettings,
    "sampling": SamplingSettings,
    "privacy": PrivacySettings,
    "system": SystemSettings,
    "distribution_shift": ShiftSettings,
    "evaluation": EvaluationSettings,
    "execution": ExecutionSettings,
}
GROUP_TITLES = {"run": "the run", "data": "data", "network": "model",
                "training": "local training", "sampling": "client sampling",
                "privacy": "privacy", "system": "clients as they are",
                "distribution_shift": "distribution shift", "evaluation": "evaluation",
                "execution": "execution"}


@dataclasses.dataclass(frozen=True, init=False)
class RunConfig:
    """Every setting of a run. Defaults follow FlexCFL's setup (B = 10, 20 clients a round).

    ``RunConfig(algorithm="fesem", fesem_lambda=0.1, clients=200)``: settings and the
    algorithm's hyperparameters by their flat keys; a whole group by its name
    (``training=TrainingSettings(lr=0.05)``, flat keys given beside it win), the
    hyperparameters as ``params=`` their dataclass.
    """

    algorithm: str = setting("fedavg", "the algorithm (a registered name: the docs' "
                                       "algorithm pages)")
    rounds: int = setting(50, "communication rounds", minimum=1)
    seed: int = setting(0, "seed of the run (initial model, sampling, shuffles)", minimum=0,
                        maximum=INT64_MAX)
    clusters: int = setting(4, "K: FeSEM centers, IFCA models, FedGroup groups, CFL's most "
                            "clusters (clustered algorithms)", minimum=1)
    data: DataSettings = dataclasses.field(default_factory=DataSettings)
    network: ModelSettings = dataclasses.field(default_factory=ModelSettings)
    training: TrainingSettings = dataclasses.field(default_factory=TrainingSettings)
    sampling: SamplingSettings = dataclasses.field(default_factory=SamplingSettings)
    privacy: PrivacySettings = dataclasses.field(default_factory=PrivacySettings)
    system: SystemSettings = dataclasses.field(default_factory=SystemSettings)
    distribution_shift: ShiftSettings = dataclasses.field(default_factory=ShiftSettings)
    evaluation: EvaluationSettings = dataclasses.field(default_factory=EvaluationSettings)
    execution: ExecutionSettings = dataclasses.field(default_factory=ExecutionSettings)
    params: Any = None

    def __init__(self, **values):
        params = values.pop("params", None)
        algorithm = values.get("algorithm", "fedavg")
        if not isinstance(algorithm, str):
            raise ConfigError(f"algorithm must be a string, got {algorithm!r}")
        spec = registry.get(algorithm)
        for f in RUN_FIELDS.values():
            value = values.pop(f.name) if f.name in values else f.default
            object.__setattr__(self, f.name, settings.check(RunConfig, f, value))
        for name, cls in GROUPS.items():
            object.__setattr__(self, name, _group(name, cls, values))
        if self.clients is None and not counts_own_clients(self.dataset):
            # Only leaf and a user's factory know their clients; the others are split over 100
            # (fedem-synthetic: the paper's 300).
            object.__setattr__(self, "data", dataclasses.replace(
                self.data, clients=default_clients(self.dataset)))
        if self.data_dir is not None:  # "~/data" in a config file means what a shell means
            object.__setattr__(self, "data", dataclasses.replace(
                self.data, data_dir=os.path.expanduser(self.data_dir)))
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
        """Any setting or hyperparameter by its flat key (or field name): ``config.lr``,
        ``config.mu``."""
        if name.startswith("__") or name in ("params", *GROUPS):
            raise AttributeError(name)
        group = GROUP_OF.get(name)
        if group is not None:
            return getattr(object.__getattribute__(self, group), name)
        params = object.__getattribute__(self, "params")
        for f in dataclasses.fields(params):
            if name in (f.name, settings.key_of(f)):
                return getattr(params, f.name)
        raise AttributeError(f"{self.algorithm!r} has no setting or hyperparameter {name!r}")

    def replace(self, **changes) -> RunConfig:
        """A new config with `changes` (flat keys). Changing the algorithm keeps the
        hyperparameters the new one shares with the old (same key) and drops the others, and
        the shared settings only some algorithms take when the new one does not
        (`not_taken_by`: K for a single-model algorithm, ...)."""
        values = self.to_dict()
        new = changes.get("algorithm", self.algorithm)
        if new != self.algorithm:
            keep = settings.fields_of(registry.get(new).params)
            for key in settings.as_flat(self.params):
                if key not in keep:
                    values.pop(key)
            for key in not_taken_by(new, changes.get("bn", self.bn)):
                values.pop(key)
        return from_dict({**values, **changes})

    def to_dict(self) -> dict[str, Any]:
        """Every setting by flat key, the algorithm's hyperparameters included (the form of
        config files and of summary.json's "config")."""
        out = {name: getattr(self, name) for name in SHARED_FIELDS}
        out["hidden"] = list(self.hidden)
        out.update(settings.as_flat(self.params))
        return out

    @property
    def clustered(self) -> bool:
        return registry.get(self.algorithm).clustered


def _group(name: str, cls: type, values: dict[str, Any]):
    """Group `name` of a config from `values` (its instance under `name`, then its flat keys,
    which are removed from `values`), every value checked."""
    base = values.pop(name, None)
    if base is not None and not isinstance(base, cls):
        raise ConfigError(f"{name} must be a {cls.__name__}, got {type(base).__name__}")
    base = base if base is not None else cls()
    kwargs = {}
    for f in dataclasses.fields(cls):
        value = values.pop(f.name) if f.name in values else getattr(base, f.name)
        kwargs[f.name] = settings.check(cls, f, value)
    return cls(**kwargs)


RUN_FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)
              if f.name not in GROUPS and f.name != "params"}
# flat key -> the group holding it (None: the run itself)
GROUP_OF: dict[str, str] = {f.name: name for name, cls in GROUPS.items()
                            for f in dataclasses.fields(cls)}
# Every shared setting by flat key, with the class that declares it, in the order of flags.
SHARED_FIELDS: dict[str, dataclasses.Field] = {
    **RUN_FIELDS, **{f.name: f for cls in GROUPS.values() for f in dataclasses.fields(cls)}}
OWNER: dict[str, type] = {**{k: RunConfig for k in RUN_FIELDS},
                          **{f.name: cls for cls in GROUPS.values()
                             for f in dataclasses.fields(cls)}}


# Shared settings that only some algorithms take: the clustered ones (K, FlexCFL's score,
# the 2-D embedding of clustered runs), and those that keep state per client (where it lives
# and its dtype). A run of another algorithm refuses them (`mcfl.runs.plan`).
CLUSTERED_ONLY = ("clusters", "score", "embed_clients")
KEPT_STATE_ONLY = ("client_store", "client_store_dtype")
# A value of such a setting that asks nothing of an algorithm without it: no 2-D embedding.
INERT_VALUES: dict[str, Any] = {"embed_clients": 0}


def asks_nothing(key: str, value: Any) -> bool:
    """Whether `value` of the shared setting `key` asks nothing of an algorithm that does not
    take it (its default, or `INERT_VALUES`), so such a run may carry it."""
    return value == SHARED_FIELDS[key].default or (key in INERT_VALUES
                                                  and value == INERT_VALUES[key])


def keeps_client_state(algorithm: str, bn: str) -> bool:
    """Whether a run of `algorithm` keeps something per client: its own state, or FedBN's
    batch-norm layers (`bn` local), which are rows of the client store too."""
    return registry.get(algorithm).keeps != "nothing" or bn == "local"


def not_taken_by(algorithm: str, bn: str = "global") -> tuple[str, ...]:
    """The shared settings `algorithm` (with batch norm `bn`) does not take (`CLUSTERED_ONLY`,
    `KEPT_STATE_ONLY`): what changing a config's algorithm to it drops, as it drops the
    hyperparameters it does not share."""
    spec = registry.get(algorithm)
    return ((() if spec.clustered else CLUSTERED_ONLY)
            + (() if keeps_client_state(algorithm, bn) else ("client_store",))
            # (FedBN's layers are kept in float32 whatever the dtype of an algorithm's rows)
            + (() if spec.keeps != "nothing" else ("client_store_dtype",)))


def algorithm_names() -> tuple[str, ...]:
    return registry.names()


def all_keys() -> dict[str, Any]:
    """Every flat key a config can hold: the shared settings, then every algorithm's
    hyperparameters (a key shared by several algorithms once)."""
    return {**SHARED_FIELDS, **{k: None for k in registry.owners_of_keys()}}


def hint_of(key: str):
    """The type of flat key `key`: a shared setting's or some algorithm's hyperparameter's."""
    if key in SHARED_FIELDS:
        return settings.type_of(OWNER[key], SHARED_FIELDS[key])
    for owner in registry.owners_of_keys().get(key, []):
        cls = registry.get(owner).params
        return settings.type_of(cls, settings.fields_of(cls)[key])
    raise ConfigError(f"unknown config key {key!r}; allowed: {', '.join(all_keys())}")


def markdown_table() -> str:
    """The docs' table of the shared settings, by concern (docs/guide/running.md; generated,
    a test keeps the page in step): flag, meaning, default."""
    lines = ["| flag | meaning | default |", "| --- | --- | --- |"]
    for group in ("run", *GROUPS):
        lines.append(f"| *{GROUP_TITLES[group]}* | | |")
        for key, f in SHARED_FIELDS.items():
            if GROUP_OF.get(key, "run") == group:
                doc = ("one of the registered algorithms (the algorithm pages)"
                       if key == "algorithm" else settings.doc_of(f))
                default = "-" if f.default is None else f"`{settings.shown(f.default)}`"
                lines.append(f"| {settings.flag_text(key, isinstance(f.default, bool))} | "
                             f"{doc.replace('|', '/')} | "
                             f"{default} |")
    return "\n".join(lines)


def _validate(c: RunConfig) -> None:
    """The checks of a config's own values: a known dataset and partition (`check_data`), a
    model that can be found. What the settings mean together is the plan's to check
    (`mcfl.runs.plan.resolve`), so that a sweep's members may complete a base config."""
    check_data(c.data)
    check_model_name(c.model)


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
    if isinstance(values.get("scan_rounds"), bool):  # a run.json or file written before "auto"
        values["scan_rounds"] = "on" if values["scan_rounds"] else "off"
    if "hidden" in values and isinstance(values["hidden"], str):
        values["hidden"] = settings.parse_int_list(values["hidden"])
    return RunConfig(**values)


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
