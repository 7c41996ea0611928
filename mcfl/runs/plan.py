"""What a config resolves to: the one step that turns a run's settings into what will run.

`resolve(config, model=, transform=, checkpoint_every=)` is called once, at the top of
`mcfl.run`, of every member of `mcfl.sweep` and of `mcfl plan`, before anything is loaded,
built or written. It gives an immutable, typed `Plan` made of the parts each package below
takes as its own spec (as big_vision resolves a config at the top and optax builds from small
typed parts): the data (`mcfl.data.DataSpec`), the model (`mcfl.models.build.ModelChoice`),
the algorithm with its hyperparameters (`AlgorithmPlan`), the clients' local training
(`mcfl.engine.TrainingSpec`), participation (`Participation`: sampling, the clients' devices
and clock, `mcfl.system.devices.SystemModel`), privacy (`mcfl.privacy.plan.PrivacySpec`), a
distribution shift (`mcfl.algorithms.wrappers.shift.ShiftSpec`), evaluation and execution. Nothing
below `mcfl.runs` reads the config.

Every setting is consumed by exactly one part, or refused here in one line naming the flag, its
value and why it does not apply (another algorithm's, another dataset's, a rule's parameter
under another rule, a participation setting an asynchronous server does not use): two
configs that differ in a setting give different plans, or one of them is refused
(tests/test_plan_resolution.py checks it for every algorithm and setting). A plan records what
it resolved (`describe`, run.json's ``plan``; `mcfl plan` prints it) and the notes a user
should read (`notes`: roundings a setting implies).

What needs the data (a natural dataset's users, the rounds a privacy budget allows, the model
built for the data's shapes) is the execution plan's (`mcfl.runs.execution.plan_run`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple, Optional

import jax

from mcfl import settings
from mcfl.algorithms.framework import registry
from mcfl.algorithms.framework.base import FederatedAlgorithm, Hyperparams
from mcfl.algorithms.framework.registry import AlgorithmContext, RunShape
from mcfl.algorithms.wrappers.local_norm import with_local_norm
from mcfl.algorithms.wrappers.poisson import with_poisson_sampling
from mcfl.algorithms.wrappers.schedule import with_schedule
from mcfl.algorithms.wrappers.shift import ShiftSpec, with_shift
from mcfl.algorithms.wrappers.system_rounds import with_system
from mcfl.config import SHARED_FIELDS, RunConfig, asks_nothing, keeps_client_state
from mcfl.data import DataSpec, resolve_data
from mcfl.engine import LocalTraining, TrainingSpec
from mcfl.engine.sampling import resolve_clients_per_round
from mcfl.errors import ConfigError
from mcfl.files.checkpoint import check_every
from mcfl.models.build import ModelChoice, choose_model, model_label, model_of
from mcfl.privacy import support
from mcfl.privacy.plan import CANARY_SEED_OFFSET, PrivacySpec
from mcfl.runtime import memory
from mcfl.system.devices import SystemModel, model_megabytes, system_model
from mcfl.system.trace import read_trace
from mcfl.transforms import IDENTITY, MessageTransform


def flag(key: str) -> str:
    """A setting's command-line flag (``--clients-per-round``)."""
    return "--" + key.replace("_", "-")


def _shown(value) -> str:
    return settings.shown(value) if not isinstance(value, dict) else str(dict(value))


@dataclasses.dataclass(frozen=True)
class AlgorithmPlan:
    """The algorithm a run builds: its registered `name`, its hyperparameters (`params`, the
    registered dataclass, checked against the run), K (`clusters`; 1 for a single-model
    algorithm) and the dtype its per-client rows are stored in."""

    name: str
    params: Any
    clusters: int = 1
    store_dtype: str = "float32"

    @property
    def spec(self) -> registry.AlgorithmSpec:
        return registry.get(self.name)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "params": settings.as_flat(self.params),
                "clusters": self.clusters, "store_dtype": self.store_dtype}


@dataclasses.dataclass(frozen=True)
class Participation:
    """Who takes part each round: `clients_per_round` as given (a count, a fraction or None:
    min(20, C)), `per_round` the count it resolves to (None until the clients are counted),
    the `sampling` rule (random | round_robin_first | poisson; "clock" for an asynchronous
    server, whose clients come as slots free up), the clients' devices (`system`, None
    without any) and the chance a sampled client drops out (`dropout`, traced; None: none
    do)."""

    clients_per_round: Any
    per_round: Optional[int]
    sampling: str
    system: Optional[SystemModel]
    dropout: Optional[float] = None

    def describe(self) -> dict[str, Any]:
        return {"clients_per_round": self.clients_per_round, "per_round": self.per_round,
                "sampling": self.sampling, "dropout": self.dropout,
                "system": None if self.system is None else _system_text(self.system)}


@dataclasses.dataclass(frozen=True)
class EvaluationSpec:
    """When a run is scored and how: every `eval_every` rounds (and after the last), the
    `score` its best accuracy is read by (mcfl | paper) and the clients embedded in 2-D
    after a clustered run (`embed_clients`, 0 for others)."""

    eval_every: int
    score: str
    embed_clients: int


@dataclasses.dataclass(frozen=True)
class ExecutionSpec:
    """How the computation runs: rounds scanned between evaluations (auto | on | off),
    clients per vmapped block (None: the engine's rule), devices (None: all), where the
    clients' kept state lives, and the checkpoint cadence in rounds (None: every 5 minutes of
    a run with a folder); scanned chunks end at checkpoint rounds."""

    scan_rounds: str
    block_size: Optional[int]
    devices: Optional[int]
    client_store: str
    checkpoint_every: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Plan:
    """A config resolved (module docstring). `config` is what it was resolved from (the model
    recorded by its label); it is not part of the plan's identity: two plans are equal when
    they will run the same."""

    config: RunConfig = dataclasses.field(compare=False, repr=False)
    algorithm: AlgorithmPlan
    rounds: int
    seed: int
    data: DataSpec
    model: ModelChoice
    training: TrainingSpec
    participation: Participation
    privacy: Optional[PrivacySpec]
    shift: Optional[ShiftSpec]
    evaluation: EvaluationSpec
    execution: ExecutionSpec
    transform: MessageTransform = dataclasses.field(default=IDENTITY, compare=False)
    transform_name: str = "identity"
    notes: tuple[str, ...] = ()

    @property
    def clustered(self) -> bool:
        return self.algorithm.spec.clustered

    @property
    def asynchronous(self) -> bool:
        return self.algorithm.spec.asynchronous

    def with_clients(self, clients: int) -> Plan:
        """This plan for a dataset found to hold `clients` clients (a natural dataset's users,
        counted when it was loaded): resolved again, so that everything the count decides is
        checked."""
        return resolve(self.config.replace(clients=clients), self.model.model
                       if self.config.model.startswith("python:") else None,
                       self.transform, self.execution.checkpoint_every)

    def local_training(self, model, values: Optional[Mapping[str, Any]] = None
                       ) -> LocalTraining:
        """The clients' local training of `model` (no proximal term: an algorithm that wants
        one, FedProx or FeSEM, adds its own); `values` (flat keys: a sweep member's traced
        numbers) replace the plan's."""
        values = values or {}
        return self.training.local_training(model, values.get("lr"), values.get("momentum"))

    def hyperparams(self, model, values: Optional[Mapping[str, Any]] = None,
                    privacy=None) -> Hyperparams:
        """What the algorithm runs with (`mcfl.algorithms.framework.base.Hyperparams`): the plan's
        numbers, or `values` (by flat key) in their place; `privacy`: the run's
        `mcfl.privacy.plan.PrivacyPlan` (DP's clipping norm and noise), if any."""
        values = values or {}
        params = self.algorithm.params
        fields = settings.fields_of(type(params))
        own = {fields[k].name: v for k, v in values.items() if k in fields}
        if own:
            params = dataclasses.replace(params, **own)
        shift_prob = 0.0 if self.shift is None or self.shift.prob is None else self.shift.prob
        dropout = self.participation.dropout
        return Hyperparams(self.local_training(model, values), params,
                           values.get("shift_prob", shift_prob),
                           None if privacy is None else privacy.settings(values),
                           values.get("client_dropout", 0.0 if dropout is None else dropout))

    def context(self, model, clients_per_round: int,
                block_size: Optional[int] = None) -> AlgorithmContext:
        """What the algorithm is built from; `block_size`: the execution plan's
        (`mcfl.runs.execution.RunPlan.train_block`)."""
        return AlgorithmContext(model, clients_per_round, self.algorithm.clusters,
                                self.algorithm.store_dtype, block_size,
                                self.participation.system)

    def build_algorithm(self, model, clients_per_round: int,
                        block_size: Optional[int] = None) -> FederatedAlgorithm:
        """The algorithm, trained on data that shifts if the plan says so, on the clients its
        participation names (its schedule, Poisson sampling, the clock). Built once; its
        hyperparameters come with each call (`hyperparams`)."""
        spec = self.algorithm.spec
        context = self.context(model, clients_per_round, block_size)
        algorithm = spec.build(context)
        if spec.asynchronous:  # its server steps come from the clock (mcfl.system.events)
            return algorithm
        if self.model.norm_state == "local":
            algorithm = with_local_norm(algorithm, model.collections, spec.name)
        if self.shift is not None:
            algorithm = with_shift(algorithm, self.shift.kind, self.shift.interval or 50)
        participation = self.participation
        if participation.sampling == "poisson":
            algorithm = with_poisson_sampling(algorithm, participation.clients_per_round)
        else:
            algorithm = with_schedule(algorithm, participation.sampling, clients_per_round)
        if participation.system is None:
            return algorithm
        return with_system(algorithm, participation.system, participation.clients_per_round,
                           model_megabytes(jax.eval_shape(model.init, jax.random.key(0))))

    def describe(self) -> dict[str, Any]:
        """The plan as JSON values, every default filled in (run.json's ``plan``)."""
        return {
            "algorithm": self.algorithm.describe(),
            "rounds": self.rounds, "seed": self.seed,
            "data": self.data.describe(),
            "model": self.model.describe(),
            "training": self.training._asdict(),
            "participation": self.participation.describe(),
            "privacy": None if self.privacy is None else self.privacy.describe(),
            "shift": None if self.shift is None else self.shift._asdict(),
            "evaluation": dataclasses.asdict(self.evaluation),
            "execution": dataclasses.asdict(self.execution),
            "transform": self.transform_name,
            "notes": list(self.notes),
        }


def _system_text(system: SystemModel) -> dict[str, Any]:
    out = dataclasses.asdict(system)
    for key in ("speeds", "bandwidth"):
        value = getattr(system, key)
        out[key] = None if value is None else f"{value.name}:" + ",".join(
            f"{p:g}" for p in value.params)
    a = system.availability
    out["availability"] = ("always" if a.kind == "always" else
                           f"diurnal:{a.period:g},{a.on_fraction:g}" if a.kind == "diurnal"
                           else f"trace:{a.period:g}")
    return out


class _Refuser(NamedTuple):
    """Refusals of settings moved off their defaults, in one line each."""

    config: RunConfig

    def given(self, key: str) -> bool:
        """Whether `key` (a shared setting) holds other than its default."""
        return getattr(self.config, key) != SHARED_FIELDS[key].default

    def unless(self, condition: bool, key: str, why: str) -> None:
        """Refuse `key` when it is off its default and `condition` fails, saying `why`."""
        if not condition and self.given(key):
            raise ConfigError(f"{flag(key)} {_shown(getattr(self.config, key))} {why}")


def resolve(config: RunConfig, model: Any = None, transform: Optional[MessageTransform] = None,
            checkpoint_every: Optional[int] = None) -> Plan:
    """`config` resolved into the `Plan` of what will run (module docstring); `model` is a
    user's model object (the config then records its label), `transform` what every client
    message goes through, `checkpoint_every` the checkpoint cadence in rounds. A setting that
    does not apply, or settings that contradict each other, raise `ConfigError` in one line."""
    if not isinstance(config, RunConfig):
        raise ConfigError(f"a run needs a mcfl.RunConfig, got {type(config).__name__}")
    if model is not None:
        label = model_label(model)
        if config.model != label:
            config = config.replace(model=label)
    transform = transform or IDENTITY
    refuse = _Refuser(config)
    spec = registry.get(config.algorithm)
    notes: list[str] = []

    training = _training(config, refuse)
    system = _system(config)
    shape = RunShape(config.clients, config.rounds, config.clusters if spec.clustered else 1,
                     training, private=config.dp_clip is not None,
                     clock=system is not None or spec.asynchronous)
    algorithm = _algorithm(config, spec, refuse, shape)
    data = resolve_data(config.data, config.seed)
    choice = choose_model(model_of(config.model, model), config.model,
                          config.model_args, config.hidden, config.conv, config.fast_paths,
                          config.precision, config.bn)
    if spec.asynchronous and config.bn == "local":
        raise ConfigError(f"--bn local keeps each client's batch-norm layers (FedBN) in a "
                          f"synchronous round; --algorithm {spec.name}'s asynchronous server "
                          f"has none")
    check = getattr(algorithm.params, "check", None)
    if check is not None:
        check(shape)
    participation = _participation(config, spec, data, refuse)
    privacy = _privacy(config, spec, algorithm, participation, refuse)
    shift = _shift(config, refuse)
    evaluation = _evaluation(config, spec, refuse)
    execution = _execution(config, spec, refuse, checkpoint_every)
    if privacy is not None and transform.acts:
        raise ConfigError(f"a run with --dp-clip sends its messages through DP's mechanism; it "
                          f"cannot also take the transform {transform.name} (chain them "
                          f"yourself: mcfl.privacy.mechanism.gaussian_mechanism)")
    memory.check_rounds_fit(config.rounds, execution.checkpoint_every)
    if config.clients is not None and spec.clustered and algorithm.clusters > config.clients:
        raise ConfigError(f"--clusters {algorithm.clusters} (K) cannot exceed the number of "
                          f"clients ({config.clients})")
    return Plan(config, algorithm, config.rounds, config.seed, data, choice, training,
                participation, privacy, shift, evaluation, execution, transform,
                transform.name, tuple(notes))


def _algorithm(config: RunConfig, spec, refuse: _Refuser, shape: RunShape) -> AlgorithmPlan:
    refuse.unless(spec.clustered, "clusters",
                  f"is K of a clustered algorithm; --algorithm {spec.name} trains "
                  f"{'one model per client or ' if spec.keeps == 'rows' else ''}one global "
                  f"model")
    params = config.params
    defaults, values = settings.as_flat(type(params)()), settings.as_flat(params)
    for key, why in registry.unused_settings(params, shape).items():
        if key in values:  # one of its own hyperparameters
            if values[key] != defaults[key]:
                raise ConfigError(f"{flag(key)} {_shown(values[key])} {why}")
        else:  # a shared setting it leaves unused
            refuse.unless(False, key, why)
    refuse.unless(spec.keeps != "nothing", "client_store_dtype",
                  f"is the dtype of what an algorithm keeps per client; --algorithm "
                  f"{spec.name} keeps nothing per client (FedBN's layers stay float32)")
    return AlgorithmPlan(spec.name, params, config.clusters if spec.clustered else 1,
                         config.client_store_dtype)


def _training(config: RunConfig, refuse: _Refuser) -> TrainingSpec:
    refuse.unless(config.local_steps is None, "local_epochs",
                  f"is replaced by --local-steps {config.local_steps} (each client takes "
                  f"that many steps whatever its epochs)")
    refuse.unless(config.client_optimizer == "momentum", "momentum",
                  f"is the momentum of --client-optimizer momentum; this run's optimizer is "
                  f"{config.client_optimizer}")
    refuse.unless(config.weight_decay > 0, "weight_decay_on",
                  "says what --weight-decay decays; this run sets no --weight-decay")
    if config.low_rank == "on" and (config.client_optimizer != "sgd" or config.weight_decay):
        raise ConfigError(
            f"--low-rank on needs plain SGD (--client-optimizer sgd, --weight-decay 0); got "
            f"--client-optimizer {config.client_optimizer}, --weight-decay "
            f"{config.weight_decay:g}")
    if config.low_rank == "on" and config.precision != "float32":
        raise ConfigError(f"--low-rank on needs --precision float32 (the factored paths compute "
                          f"in float32), got --precision {config.precision}")
    if config.low_rank == "on" and config.fast_paths == "off":
        raise ConfigError("--low-rank on is a fast path; --fast-paths off turns every one off")
    return TrainingSpec(
        lr=config.lr, batch_size=config.batch_size,
        local_epochs=config.local_epochs if config.local_steps is None else 1,
        local_steps=config.local_steps, optimizer=config.client_optimizer,
        momentum=config.momentum if config.client_optimizer == "momentum" else None,
        weight_decay=config.weight_decay,
        weight_decay_on=config.weight_decay_on if config.weight_decay > 0 else None,
        low_rank=config.low_rank)


def _system(config: RunConfig) -> Optional[SystemModel]:
    return system_model(config.device_speeds, config.bandwidth, config.latency,
                        config.device_trace, config.availability, config.client_dropout,
                        config.deadline, config.deadline_policy, config.over_select)


def _participation(config: RunConfig, spec, data: DataSpec,
                   refuse: _Refuser) -> Participation:
    system = _system(config)
    if spec.asynchronous:
        why = (f"chooses a synchronous round's clients; --algorithm {spec.name}'s server "
               f"never waits for a round: --concurrency clients train at once, each freed "
               f"slot given to a client at random")
        refuse.unless(False, "clients_per_round", why)
        refuse.unless(False, "client_sampling", why)
        if config.deadline is not None or config.over_select > 0:
            raise ConfigError(f"--algorithm {spec.name} is asynchronous: its server never "
                              f"waits for a round, so --deadline / --over-select do not apply")
    if system is not None:
        _check_system(config, system, data)
    per_round = None
    clients = config.clients
    if clients is not None and not spec.asynchronous:
        per_round = resolve_clients_per_round(config.clients_per_round, clients)
        if system is not None and system.over_select > 0 and system.slots(per_round) > clients:
            raise ConfigError(
                f"--over-select {config.over_select:g} samples ceil((1 + "
                f"{config.over_select:g}) x {per_round}) = {system.slots(per_round)} clients a "
                f"round, more than the {clients} clients; allowed: at most "
                f"{clients / per_round - 1:.4g}, or fewer --clients-per-round")
    if config.client_sampling == "poisson" and config.dp_clip is None:
        support.covered(spec.name, "--client-sampling poisson")  # its round honours the mask
    sampling = "clock" if spec.asynchronous else config.client_sampling
    return Participation(config.clients_per_round, per_round, sampling, system,
                         config.client_dropout)


def _check_system(config: RunConfig, system: SystemModel, data: DataSpec) -> None:
    """The clients-as-they-are settings together (`mcfl.system`), and the trace file read
    now (exit 2 before anything runs) when the clients are known."""
    if config.device_trace is not None and (config.device_speeds is not None
                                            or config.bandwidth is not None
                                            or config.latency > 0):
        raise ConfigError("--device-trace gives every client's speed, bandwidth and latency; "
                          "drop --device-speeds / --bandwidth / --latency, or the trace")
    if system.availability.kind == "trace" and config.device_trace is None:
        raise ConfigError(f"--availability {config.availability} reads the online intervals "
                          f"of --device-trace FILE, which is not given")
    if config.device_trace is not None and config.clients is not None:
        period = system.availability.period if system.availability.kind == "trace" else None
        trace = read_trace(config.device_trace, config.clients, period)
        if system.availability.kind != "trace" and int(trace.online_count.max()) > 0:
            raise ConfigError(f"--device-trace {config.device_trace} gives online intervals; "
                              f"give --availability trace:PERIOD (the cycle they repeat in) "
                              f"to use them, or drop the trace's online column")
    if system.samples_itself and config.client_sampling != "random":
        raise ConfigError(f"--client-sampling {config.client_sampling} chooses the round's "
                          f"clients itself; --availability / --over-select choose them among "
                          f"the online ones: use --client-sampling random with them")
    if system.samples_itself and config.dp_clip is not None:
        raise ConfigError("client-level DP accounts for clients sampled uniformly; "
                          "--availability / --over-select sample otherwise")


def _privacy(config: RunConfig, spec, algorithm: AlgorithmPlan, participation: Participation,
             refuse: _Refuser) -> Optional[PrivacySpec]:
    """DP's settings together: which algorithms take them, and which go with which."""
    given = [k for k in ("dp_noise", "dp_epsilon", "dp_delta", "dp_epsilon_budget",
                         "dp_adaptive_quantile", "dp_clip_per_layer", "dp_accountant",
                         "dp_canaries") if refuse.given(k)]
    if config.dp_clip is None:
        if given:
            raise ConfigError(f"{', '.join(flag(k) for k in given)} need(s) --dp-clip C "
                              f"(client-level DP is on when the clipping norm is given)")
        return None
    covered = support.covered(spec.name)
    if config.dp_adaptive_quantile is not None:
        support.check_adaptive(spec.name)
    if (config.dp_noise is None) == (config.dp_epsilon is None):
        raise ConfigError("client-level DP needs exactly one of --dp-noise (the noise "
                          "multiplier) and --dp-epsilon (the target it is solved for); got "
                          + ("both" if config.dp_noise is not None else "neither"))
    if config.dp_canaries and spec.name not in support.CANARY_ALGORITHMS:
        raise ConfigError(f"--dp-canaries measures the change of one global model; "
                          f"--algorithm {spec.name} is not one of "
                          f"{', '.join(support.CANARY_ALGORITHMS)}")
    if config.client_sampling == "round_robin_first":
        raise ConfigError("client-level DP accounts for random or poisson client sampling; "
                          "--client-sampling round_robin_first is neither")
    initialisation = getattr(algorithm.params, "private_initialisation", None)
    return PrivacySpec(
        clip=config.dp_clip, noise=config.dp_noise, epsilon=config.dp_epsilon,
        delta=config.dp_delta, budget=config.dp_epsilon_budget,
        adaptive_quantile=config.dp_adaptive_quantile,
        clip_per_layer=config.dp_clip_per_layer, accountant=config.dp_accountant,
        canaries=config.dp_canaries,
        sampling="poisson" if participation.sampling == "poisson" else "fixed",
        covered=covered, clustered=covered.noised_counts and algorithm.clusters > 1,
        rounds=config.rounds, canary_seed=CANARY_SEED_OFFSET + config.seed,
        before_noise=None if initialisation is None else initialisation())


def _shift(config: RunConfig, refuse: _Refuser) -> Optional[ShiftSpec]:
    swaps = config.shift in ("swap_all", "swap_part")
    refuse.unless(swaps, "shift_prob", f"is the chance of a swap of --shift swap_all or "
                  f"swap_part; this run's --shift is {config.shift}")
    refuse.unless(config.shift == "incremental", "shift_interval",
                  f"is the release interval of --shift incremental; this run's --shift is "
                  f"{config.shift}")
    if config.shift == "none":
        return None
    return ShiftSpec(config.shift, config.shift_prob if swaps else None,
                     config.shift_interval if config.shift == "incremental" else None)


def _evaluation(config: RunConfig, spec, refuse: _Refuser) -> EvaluationSpec:
    refuse.unless(spec.clustered, "score",
                  f"is FlexCFL's rule for clustered algorithms (only rounds in which every "
                  f"client has joined a group count); --algorithm {spec.name} has no groups")
    refuse.unless(spec.clustered or asks_nothing("embed_clients", config.embed_clients),
                  "embed_clients",
                  f"embeds clustered runs' clients in 2-D beside their clusters; --algorithm "
                  f"{spec.name} has no clusters")
    return EvaluationSpec(config.eval_every, config.score,
                          config.embed_clients if spec.clustered else 0)


def _execution(config: RunConfig, spec, refuse: _Refuser,
               checkpoint_every: Optional[int]) -> ExecutionSpec:
    refuse.unless(keeps_client_state(spec.name, config.bn), "client_store",
                  f"says where an algorithm's per-client state lives; --algorithm {spec.name} "
                  f"keeps nothing per client (nor FedBN's layers: --bn is global)")
    check_every(checkpoint_every)
    return ExecutionSpec(config.scan_rounds, config.block_size, config.devices,
                         config.client_store, checkpoint_every)


def check_population(plan: Plan, clients: int, held_out: int = 0) -> int:
    """The clients a round of `plan` trains on `clients` training clients (after `held_out`
    were held out by ``--unseen-share``): a message that names the share when it is what
    leaves too few. (An asynchronous server's rounds are its server steps; their count sizes
    the engine's blocks as a synchronous round's would, min(20, C).)"""
    try:
        return resolve_clients_per_round(plan.participation.clients_per_round, clients)
    except ConfigError as error:
        if not held_out:
            raise
        raise ConfigError(f"--unseen-share {plan.data.unseen_share:g} holds {held_out} of the "
                          f"{clients + held_out} clients out of training, leaving {clients}: "
                          f"{error}; give a smaller share or more clients") from None
