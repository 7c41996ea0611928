"""The execution plan of a run: what its plan (`mcfl.runs.plan`) and its dataset fix before
anything is compiled.

The plan holds the model and its size, the clients a round, whether rounds train on the
factored path, and how many clients a block of the engine holds (in training and in
evaluation): execution details the algorithm receives in its context (`AlgorithmContext.
block_size`) and passes to the engine, never chooses. It also
gives a run's PRNG keys and the device mesh its clients are sharded over.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from mcfl import engine
from mcfl.data import FederatedDataset
from mcfl.data.registry import is_user_dataset
from mcfl.errors import ConfigError, DataError, first_line
from mcfl.models import count_params
from mcfl.models.build import is_users
from mcfl.privacy.plan import privacy_plan
from mcfl.privacy.sampling import poisson_capacity
from mcfl.runs.plan import Plan, check_population
from mcfl.runtime import distributed
from mcfl.runtime.memory import out_of_memory
from mcfl.system.devices import model_megabytes


class RunPlan(NamedTuple):
    """What a plan and its dataset fix before training (shared by `mcfl.run` and the members
    of a sweep)."""

    model: Any  # mcfl.models.ModelSpec
    params_count: int
    clients_per_round: int
    low_rank: bool  # rounds train on the factored path
    block_size: int  # clients per vmapped block in training
    eval_block: int  # ... in evaluation
    # client-level DP (mcfl.privacy.plan.PrivacyPlan), None without it
    privacy: Any = None
    # the rounds between evaluations run as one lax.scan (`scans_rounds`)
    scan_rounds: bool = False
    # the rounds the run trains: the plan's, or fewer when a privacy budget stops it
    rounds: int = 1

    @property
    def train_block(self) -> int:
        """The block size of a round's work (training, gradients, losses): at most a round's
        clients."""
        return min(self.block_size, self.clients_per_round)


def plan_run(plan: Plan, dataset: FederatedDataset, backend: Optional[str] = None) -> RunPlan:
    """The execution plan of `plan` (`mcfl.runs.plan`) on `dataset` (a dataset without test
    rows is refused: runs are scored on them): the model built for the data's shapes, the
    block sizes, the privacy plan. `backend`: the platform the run is planned for (default:
    this machine's), which decides the block sizes and the model's fast paths."""
    if int(dataset.test_counts().sum()) == 0:
        if plan.data.dataset == "leaf":
            where = ("its test/*.json files list none of them, or give --test-fraction to "
                     "split their rows")
        elif is_user_dataset(plan.data.dataset):  # (its split is its factory's)
            where = ("have its factory give them test rows (mcfl.data.from_clients(train=..., "
                     "test=...), or clients=[...] to split each client's rows)")
        else:
            where = ("give a larger --test-fraction or --samples-per-client, or fewer "
                     "--clients so that each holds more rows")
        raise DataError(f"the dataset {dataset.name!r} has no test rows for its "
                        f"{dataset.num_clients} client(s); runs are scored on test rows: "
                        f"{where}")
    model = plan.model.build(dataset.feature_shape, dataset.num_classes, backend)
    if is_users(plan.model.model):
        check_first_batch(model, dataset, plan)
    init_key = jax.random.key(0)  # shapes only
    params_count = count_params(jax.eval_shape(model.init, init_key))
    held_out = 0 if dataset.unseen is None else dataset.unseen.num_clients
    per_round = check_population(plan, dataset.num_clients, held_out)
    privacy = privacy_plan(plan.privacy, dataset.num_clients, per_round)
    participation = plan.participation
    if participation.sampling == "poisson":  # the round's fixed slots (mcfl.privacy.sampling)
        per_round = poisson_capacity(dataset.num_clients, per_round)
    system = participation.system
    if system is not None and system.samples_itself:  # over-selection's extra clients
        per_round = min(system.slots(per_round), dataset.num_clients)
    # Whether rounds will train on the factored path (a shift's view makes every round dense).
    low_rank = plan.shift is None and engine.low_rank_capacity(
        plan.local_training(model), dataset.arrays,
        jax.eval_shape(jax.vmap(model.init), init_key[None])
    ) is not None
    # Blocks of the dense-stack path share products and want many clients; a CNN's factored
    # layer is per client, sized like the per-client path.
    # Every client's local steps a round, as the engine counts them (`client_num_steps`): equal
    # steps waste no step in a block of them; their mean sizes a round's training.
    steps = np.asarray(engine.client_num_steps(jnp.asarray(dataset.train_counts()),
                                               plan.training))
    if system is not None:
        check_reachable(system, steps, model)
    uniform_steps = bool(steps.size == 0 or steps.min() == steps.max())
    block_size = plan.execution.block_size or engine.default_block_size(
        params_count, per_round, low_rank=low_rank and model.dense_layers is not None,
        uniform_steps=uniform_steps, backend=backend)
    eval_block = plan.execution.block_size or engine.default_block_size(
        params_count, dataset.num_clients, backend=backend)
    mean_steps = float(steps.mean()) if steps.size else 0.0
    rounds = plan.rounds if privacy is None else min(plan.rounds, privacy.rounds)
    return RunPlan(model, params_count, per_round, low_rank, block_size, eval_block, privacy,
                   scans_rounds(plan, mean_steps, params_count, per_round), rounds)


# A round of fewer training FLOPs than this is short enough (about 10 ms on a CPU core, far
# less on an accelerator) that a host call and a device-to-host copy of its metrics are a
# visible share of it: ``--scan-rounds auto`` runs such rounds as one lax.scan between
# evaluations. (FeSEM on 100,000 MCLR clients, 100 a round of 5 steps: 1.8e7; the Fashion-MNIST
# CNN's FedAvg round of 20 clients x 12 steps: about 5e10, round by round.)
SCAN_BELOW_FLOPS = 1e9


def scans_rounds(plan: Plan, mean_steps: float, params_count: int, per_round: int) -> bool:
    """Whether the rounds between evaluations run as one lax.scan: ``--scan-rounds on|off``,
    or with ``auto`` when a round's training is under `SCAN_BELOW_FLOPS` by the dense rule of
    thumb (6 FLOPs per parameter per example: forward and backward) over `mean_steps`, the
    clients' mean local steps a round. A client store on the host or on disk runs round by
    round whatever this says (`mcfl.runs.stored_rounds`)."""
    scan = plan.execution.scan_rounds
    if scan != "auto":
        return scan == "on"
    return 6.0 * params_count * plan.training.batch_size * mean_steps * per_round \
        < SCAN_BELOW_FLOPS


def check_reachable(system, steps: np.ndarray, model) -> None:
    """Refuse a run whose clients can never report: when every client's device is fixed
    before the run (constant speed and bandwidth, not drawn), diurnal availability keeps each
    online for on-fraction x period seconds at a time, and even the client with the fewest
    local steps needs longer than that for a round, no round would ever hear from anyone.
    (With drawn devices some client may be fast enough; the clock then moves on.)"""
    availability = system.availability
    if availability.kind != "diurnal" or availability.on_fraction >= 1 or system.trace:
        return
    fixed = all(d is None or d.name == "constant" for d in (system.speeds, system.bandwidth))
    if not fixed or steps.size == 0:
        return
    speed = 1.0 if system.speeds is None else system.speeds.params[0]
    bandwidth = math.inf if system.bandwidth is None else system.bandwidth.params[0]
    megabytes = model_megabytes(jax.eval_shape(model.init, jax.random.key(0)))
    fewest = int(steps.min())
    seconds = 2 * (megabytes / bandwidth + system.latency) + fewest / speed
    window = availability.on_fraction * availability.period
    if seconds > window:
        raise ConfigError(
            f"no client can ever report: the quickest takes {seconds:.4g} simulated seconds "
            f"for a round ({fewest} local steps at {speed:g} a second, and its messages), "
            f"longer than the {window:.4g} s that --availability "
            f"diurnal:{availability.period:g},{availability.on_fraction:g} keeps it online; "
            f"give faster --device-speeds, a longer period or on-fraction, or fewer "
            f"--local-steps")


def check_first_batch(model, dataset: FederatedDataset, plan: Plan) -> None:
    """Refuse a user's model whose logits at the run's initial parameters are NaN or infinite on
    the first batch of training rows (in evaluation mode, and in training mode where it has
    one): it would diverge in round 1, and the fault is the model's (the rows are finite:
    every loader checks them). One small compiled forward; a `ConfigError` naming the model."""
    rows = min(plan.training.batch_size, int(dataset.arrays.x_train.shape[0]))
    x = dataset.arrays.x_train[:rows]
    init_key, _ = run_keys(plan.seed)

    def finite(key, x):
        variables = model.init(key)
        modes = {"evaluation": model.apply(variables, x)}
        if model.train_apply is not None:
            modes["training"] = model.train_apply(variables, x, jax.random.fold_in(key, 1))[0]
        return {mode: jnp.all(jnp.isfinite(logits)) for mode, logits in modes.items()}

    try:
        found = jax.device_get(jax.jit(finite)(init_key, x))
    except Exception as e:  # noqa: BLE001 - a failure of the user's model when it runs
        if out_of_memory(e) is not None:
            raise
        raise ConfigError(f"model {model.name!r} fails on the first batch of training rows "
                          f"({rows}): {first_line(e)}") from None
    bad = [mode for mode, ok in found.items() if not ok]
    if bad:
        raise ConfigError(f"model {model.name!r} gives non-finite logits (NaN or infinity) on "
                          f"the first batch ({rows} training rows, at its initial parameters, "
                          f"in {' and '.join(bad)} mode); the data are finite, so look at its "
                          f"forward pass (a log or division of 0, an overflow)")


def seed_key(seed: int) -> jax.Array:
    """The PRNG key of a seed in [0, 2^63 - 1]. ``jax.random.key`` keeps only 32 bits without
    x64 (``key(2**40)`` is ``key(0)``), so a seed's upper bits are folded in: seeds below 2^32
    keep their plain key, and distinct seeds never share one."""
    key = jax.random.key(seed & 0xFFFFFFFF)
    high = seed >> 32
    return key if high == 0 else jax.random.fold_in(key, high)


class RunKeys(NamedTuple):
    """A run's two keys, each with one job: `init` makes the initial state, `rounds` every
    round (round r's key is ``fold_in(rounds, r)``, which the algorithm splits in turn:
    `mcfl.algorithms.framework.base.sampled` samples with the first half, training uses the
    second)."""

    init: jax.Array
    rounds: jax.Array


def run_keys(seed: int) -> RunKeys:
    """The `RunKeys` of a run with `seed`."""
    init_key, rounds_key = jax.random.split(seed_key(seed))
    return RunKeys(init_key, rounds_key)


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
