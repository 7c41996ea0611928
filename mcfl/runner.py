"""`mcfl.run(config)`: build the data, model and algorithm a config names and train it.

The training loop prints and writes nothing: it tells its observers (`RunObserver`) about each
round, the end and any stop, and a `progress` callback about each round. `mcfl.run(config,
out_dir=...)` adds the run-folder observer of `mcfl.apps.output`, under which rounds.csv grows
one row per round as the run goes, so a run that stops early (NaN, Ctrl-C) keeps every round
it finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from mcfl import distributed, engine
from mcfl.algorithms import FederatedAlgorithm, build_algorithm, hyperparams, local_training
from mcfl.algorithms.base import scan_rounds
from mcfl.checkpoint import Checkpoints, StopRequests, check_every
from mcfl.config import RunConfig
from mcfl.data import FederatedDataset, load_dataset, with_all_users
from mcfl.errors import ConfigError, TrainingDivergedError
from mcfl.evaluation import aggregate, client_metrics
from mcfl.models import count_params, make_model
from mcfl.sampling import resolve_clients_per_round

EVAL_KEYS = ("accuracy_micro", "accuracy_macro", "f1_micro", "f1_macro")
PAPER_SCORE = "paper_best_accuracy_micro"


@dataclasses.dataclass
class RunResult:
    """Everything a run produced: what the output folder holds, as Python objects."""

    config: RunConfig
    summary: dict[str, Any]
    rounds: list[dict[str, Any]]
    clients: list[dict[str, Any]]
    state: Any
    # [E, C] cluster of every client after each evaluated round, and those rounds [E]
    assignments: Optional[np.ndarray] = None
    assignment_rounds: Optional[np.ndarray] = None
    # clustered runs: sampled clients' local models in 2-D (mcfl.embedding), as NumPy arrays
    client_embedding: Optional[dict[str, np.ndarray]] = None

    def write(self, out_dir) -> Path:
        """Write the run folder (summary.json, rounds.csv, clients.csv, curves.png, ...)."""
        from mcfl.apps.output import write_result

        return write_result(Path(out_dir), self)


class RunObserver:
    """What the training loop tells about a run as it goes (all methods optional no-ops):
    `started` before round 1 (with the columns only evaluated rounds will have), `round` with
    every round's row, `stopped` with the summary of a run that ends early (its "status" says
    why), `finished` with the result of a completed run."""

    def started(self, config: RunConfig, later_columns: tuple[str, ...]) -> None: ...

    def round(self, row: dict[str, Any]) -> None: ...

    def stopped(self, summary: dict[str, Any]) -> None: ...

    def finished(self, result: RunResult) -> None: ...


class _Progress(RunObserver):
    def __init__(self, callback: Callable[[int, dict], None]):
        self._callback = callback

    def round(self, row):
        self._callback(row["round"], row)


def evaluate(
    algorithm: FederatedAlgorithm, state, dataset: FederatedDataset, apply_fn, block_size: int
):
    """Per-client test metrics of the models `algorithm` assigns to each client."""
    return Evaluator(algorithm, apply_fn, block_size)(state, dataset)


def run(
    config: Optional[RunConfig] = None,
    out_dir: Optional[str | Path] = None,
    progress: Optional[Callable[[int, dict], None]] = None,
    dataset: Optional[FederatedDataset] = None,
    cache_dir: Optional[str | Path] = None,
    profile_dir: Optional[str | Path] = None,
    observers: tuple[RunObserver, ...] = (),
    overwrite: bool = False,
    resume: Optional[str | Path] = None,
    checkpoint_every: Optional[int] = None,
) -> RunResult:
    """Train `config` and return its results; write them under `out_dir` if given (through
    `mcfl.apps.output.RunFolder`). A folder already holding a run is refused (`McflError`,
    before anything runs) unless `overwrite`, which deletes that run's files first.

    A run with a folder keeps an orbax checkpoint in ``out_dir/checkpoints`` (`mcfl.checkpoint`):
    every `checkpoint_every` rounds (default: every 5 minutes), at the end, and when SIGINT or
    SIGTERM stops it (at the end of the round, or of the scanned chunk, under way).
    ``run(resume=RUN_DIR)`` continues the run stopped there from its checkpoint, with the
    config saved in it (`config`, if given, must equal it), writing to RUN_DIR; its rounds and
    summary equal the uninterrupted run's apart from timings.

    `progress(round, row)` is called after every round with that round's metrics; `observers`
    hear about every round and the end (`RunObserver`). A prepared
    `dataset` may be passed to reuse it across runs (it must match the config's clients).
    With `cache_dir`, the prepared dataset is read from / written to that cache. With
    `profile_dir`, a jax.profiler trace of rounds 2-3 (compiled, steady state; round 1 if the
    run has one round; with ``config.scan_rounds``, the second chunk of rounds) is written there
    for TensorBoard or Perfetto.
    """
    if resume is not None:
        config, out_dir = _resumed_config(config, Path(resume), out_dir)
    elif config is None:
        raise ConfigError("run() needs a config, or resume=RUN_DIR to continue a stopped run")
    check_every(checkpoint_every)
    mesh = _client_mesh(config.devices)
    if out_dir is not None and distributed.is_leader() and resume is None:
        from mcfl.apps.output import prepare_folder

        prepare_folder(Path(out_dir), overwrite)
    checkpoints = None
    if out_dir is not None and distributed.process_count() == 1:
        checkpoints = Checkpoints(Path(out_dir), checkpoint_every)
    started = time.perf_counter()
    # Built outside the mesh: each process builds the same data from the config and seed
    # as plain (single-device) arrays; the rounds use them as replicated inputs.
    if dataset is None:  # a natural dataset with no `clients` is loaded to count its users
        config, dataset = with_all_users(config, cache_dir)
    elif config.clients is None:
        config = config.replace(clients=dataset.num_clients)
    if dataset is None:
        dataset = load_dataset(config, cache_dir)
    with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):
        observers = tuple(observers)
        if progress is not None:
            observers += (_Progress(progress),)
        if out_dir is not None:
            from mcfl.apps.output import RunFolder

            observers += (RunFolder(Path(out_dir)),)
        if not distributed.is_leader():  # in a multi-process run, process 0 reports
            observers = ()
        try:
            return _run(config, dataset, started, observers, profile_dir, mesh, checkpoints,
                        None if resume is None else Path(resume))
        finally:
            if checkpoints is not None:
                checkpoints.close()


def _resumed_config(config: Optional[RunConfig], run_dir: Path, out_dir
                    ) -> tuple[RunConfig, Path]:
    """The config saved in `run_dir`'s checkpoint (checked against `config` if one is given)
    and the folder a resumed run writes to: its own."""
    from mcfl import checkpoint
    from mcfl.config import from_dict

    if out_dir is not None and Path(out_dir).resolve() != run_dir.resolve():
        raise ConfigError(f"a resumed run writes to its own folder {str(run_dir)!r}, not "
                          f"{str(out_dir)!r}")
    saved = from_dict(checkpoint.latest(run_dir).config)
    if config is not None and config.to_dict() != saved.to_dict():
        mine, theirs = config.to_dict(), saved.to_dict()
        changed = [f"{k}={mine.get(k)!r} (checkpoint: {theirs.get(k)!r})"
                   for k in dict.fromkeys([*mine, *theirs]) if mine.get(k) != theirs.get(k)]
        raise ConfigError(f"the config differs from the one checkpointed in {str(run_dir)!r}: "
                          + ", ".join(changed) + "; a run resumes with its own config")
    return saved, run_dir


class RunPlan(NamedTuple):
    """What a config and its dataset fix before training: the model, its size, the clients a
    round and how they are blocked (shared by `run` and the members of a sweep)."""

    model: Any  # mcfl.models.ModelSpec
    params_count: int
    clients_per_round: int
    low_rank: bool  # rounds train on the factored path
    block_size: int  # clients per vmapped block in training
    eval_block: int  # ... in evaluation


def seed_key(seed: int) -> jax.Array:
    """The PRNG key of a seed in [0, 2^63 - 1]. ``jax.random.key`` keeps only 32 bits without
    x64 (``key(2**40)`` is ``key(0)``), so a seed's upper bits are folded in: seeds below 2^32
    keep their plain key, and distinct seeds never share one."""
    key = jax.random.key(seed & 0xFFFFFFFF)
    high = seed >> 32
    return key if high == 0 else jax.random.fold_in(key, high)


def run_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """(initialisation key, rounds key) of a run with `seed`; round r uses
    ``fold_in(rounds_key, r)``."""
    init_key, rounds_key = jax.random.split(seed_key(seed))
    return init_key, rounds_key


def plan_run(config: RunConfig, dataset: FederatedDataset) -> RunPlan:
    if int(dataset.test_counts().sum()) == 0:
        from mcfl.errors import DataError

        raise DataError(f"the dataset {dataset.name!r} has no test rows for its "
                        f"{dataset.num_clients} client(s) (a LEAF folder: its test/*.json list "
                        "none of them); runs are scored on test rows")
    model = make_model(config.model, dataset.feature_shape, dataset.num_classes, config.hidden,
                       config.conv)
    init_key = jax.random.key(0)  # shapes only
    params_count = count_params(jax.eval_shape(model.init, init_key))
    per_round = resolve_clients_per_round(config.clients_per_round, dataset.num_clients)
    # Whether rounds will train on the factored path (a shift's view makes every round dense).
    low_rank = config.shift == "none" and engine.low_rank_capacity(
        local_training(config, model), dataset.arrays,
        jax.eval_shape(jax.vmap(model.init), init_key[None])
    ) is not None
    # Blocks of the dense-stack path share products and want many clients; a CNN's factored
    # layer is per client, sized like the per-client path.
    block_size = config.block_size or engine.default_block_size(
        params_count, per_round, low_rank=low_rank and model.dense_layers is not None)
    eval_block = config.block_size or engine.default_block_size(params_count, dataset.num_clients)
    return RunPlan(model, params_count, per_round, low_rank, block_size, eval_block)


def _client_mesh(devices: Optional[int]) -> Optional[jax.sharding.Mesh]:
    """The mesh that shards clients over `devices` devices (None: all of them, of every
    process); None for one device."""
    available = len(jax.devices())
    count = available if devices is None else devices
    if count > available:
        raise ConfigError(f"devices={count} but this machine has {available} "
                          f"{jax.default_backend()} device(s); use --devices 1..{available}")
    if distributed.process_count() > 1 and count != available:
        raise ConfigError(f"a run over {distributed.process_count()} processes uses all their "
                          f"{available} devices; leave --devices unset")
    return None if count == 1 else engine.client_mesh(count)


def _run(
    config: RunConfig,
    dataset: FederatedDataset,
    started: float,
    observers: tuple[RunObserver, ...] = (),
    profile_dir: Optional[str | Path] = None,
    mesh: Optional[jax.sharding.Mesh] = None,
    checkpoints=None,  # mcfl.checkpoint.Checkpoints of the run folder
    resume_dir: Optional[Path] = None,
) -> RunResult:
    replicated = distributed.replicated_outputs(mesh)
    if dataset.num_clients != config.clients:
        raise ConfigError(
            f"the dataset passed has {dataset.num_clients} clients but the config says "
            f"clients={config.clients}; build it from the same config"
        )
    data = dataset.arrays
    init_key, rounds_key = run_keys(config.seed)
    plan = plan_run(config, dataset)
    model, per_round = plan.model, plan.clients_per_round
    algorithm = build_algorithm(config, model, per_round)
    hp = hyperparams(config, model)
    with engine.planned_block_size(min(plan.block_size, per_round)):
        return _train(config, dataset, started, observers, profile_dir, checkpoints, resume_dir,
                      replicated, data, init_key, rounds_key, plan, algorithm, hp)


def _train(config, dataset, started, observers, profile_dir, checkpoints, resume_dir,
           replicated, data, init_key, rounds_key, plan, algorithm, hp):
    model, params_count, per_round = plan.model, plan.params_count, plan.clients_per_round
    low_rank, block_size, eval_block = plan.low_rank, plan.block_size, plan.eval_block

    init_start = time.perf_counter()
    # (blocked on: dispatch is asynchronous, and an initialisation that trains every client,
    # FeSEM's, would otherwise be counted in round 1)
    state = jax.block_until_ready(jax.jit(
        lambda data, key: algorithm.init(data, key, hp), **replicated)(data, init_key))
    init_seconds = time.perf_counter() - init_start
    rounds = RoundRunner(algorithm, hp, config.scan_rounds, replicated)
    evaluator = Evaluator(algorithm, model.apply, eval_block, replicated)
    chunks = round_chunks(config.rounds, config.eval_every, config.scan_rounds)
    later = ()
    if algorithm.assignments is not None:  # cluster metrics arrive with evaluated rounds
        later = ("cluster_sizes", "clients_waiting") + (("cluster_ari", "cluster_nmi")
                                      if dataset.true_cluster is not None else ())
    rows: list[dict[str, Any]] = []
    evaluated_assignments: list[np.ndarray] = []
    assignment_rounds: list[int] = []
    round_seconds: list[float] = []
    if resume_dir is not None:
        state, done = _restore(resume_dir, state, rounds_key, config, rows, round_seconds,
                               evaluated_assignments, assignment_rounds)
        chunks = [(first, count) for first, count in chunks if first > done]
    comm_total = rows[-1]["comm_params_total"] if rows else 0
    for observer in observers:
        observer.started(config, later)
        for row in rows:  # a resumed run's rows so far
            observer.round(row)
    metrics = None
    # Compile every program the run needs before the first round (from JAX's persistent cache
    # when it holds them), so that round times are training alone.
    compile_start = time.perf_counter()
    for count in sorted({count for _, count in chunks}):
        rounds.compile(state, data, rounds_key, count)
    evaluator.compile(state, dataset)
    compile_seconds = time.perf_counter() - compile_start

    def summary_with(status: str) -> dict[str, Any]:
        summary = _summary(config, dataset, rows, round_seconds, started, params_count,
                           per_round, block_size, status)
        return {**summary, "init_seconds": init_seconds, "compile_seconds": compile_seconds,
                "low_rank": low_rank, "devices": engine.client_shards()}

    # Profile the first host calls after round 1: rounds 2-3, or the second scanned chunk.
    last = len(chunks) - 1
    profiled = range(min(1, last), min(1 if config.scan_rounds else 2, last) + 1)
    profiled = profiled if profile_dir else range(0)
    tracing = False

    def save_checkpoint(last_round: int) -> None:
        checkpoints.save(last_round, state, rounds_key, config.to_dict(),
                         {"rows": rows, "round_seconds": round_seconds,
                          "assignment_rounds": assignment_rounds}, evaluated_assignments)

    # With checkpoints, SIGINT / SIGTERM stop the run at the end of a host call, where the
    # state is whole and can be checkpointed (mcfl.checkpoint.StopRequests).
    stop_requests = StopRequests() if checkpoints is not None else None
    try:
        with stop_requests or contextlib.nullcontext():
            for c, (first, count) in enumerate(chunks):
                if c == profiled.start and c in profiled:
                    jax.profiler.start_trace(str(profile_dir))
                    tracing = True
                t0 = time.perf_counter()
                state, chunk_metrics = rounds.run(state, data, rounds_key, first, count)
                seconds = (time.perf_counter() - t0) / count
                for i in range(count):
                    r = first + i
                    row = {"round": r, **{k: float(v[i]) for k, v in chunk_metrics.items()},
                           "seconds": seconds}
                    if not all(math.isfinite(v) for v in row.values()):
                        raise TrainingDivergedError(_divergence(config, row, rows))
                    round_seconds.append(seconds)
                    comm_total += add_communication(row, params_count, comm_total)
                    if i == count - 1 and (r % config.eval_every == 0 or r == config.rounds):
                        # Population-wide work (evaluation, cluster recovery) only here.
                        metrics = evaluator(state, dataset)
                        row.update(aggregate(metrics))
                        if algorithm.assignments is not None:
                            assigned = np.asarray(jax.device_get(algorithm.assignments(state)))
                            evaluated_assignments.append(assigned)
                            assignment_rounds.append(r)
                            row.update(cluster_metrics(assigned, dataset.true_cluster))
                    rows.append(row)
                    for observer in observers:
                        observer.round(row)
                if tracing and c == profiled[-1]:
                    jax.profiler.stop_trace()
                    tracing = False
                last = first + count - 1
                stopping = stop_requests is not None and stop_requests.requested is not None
                if checkpoints is not None and (
                        stopping or last == config.rounds or checkpoints.due(last)):
                    save_checkpoint(last)
                if stopping:
                    raise KeyboardInterrupt(f"signal {stop_requests.requested}")
    except BaseException as stop:  # every stop leaves a summary with its status
        status = ("diverged" if isinstance(stop, TrainingDivergedError)
                  else "interrupted" if isinstance(stop, KeyboardInterrupt) else "error")
        for observer in observers:
            observer.stopped(summary_with(status))
        raise
    finally:
        if tracing:  # a run stopped inside the profiled rounds
            jax.profiler.stop_trace()

    summary = summary_with("completed")
    final_assignment = evaluated_assignments[-1] if evaluated_assignments else None
    clients = _client_rows(dataset, metrics, final_assignment)
    stacked = np.stack(evaluated_assignments) if evaluated_assignments else None
    embedding = None
    if algorithm.assignments is not None and config.embed_clients > 0:
        embedding = _embedding(algorithm, config, hp, state, data, rounds_key,
                               final_assignment, dataset)
    result = RunResult(config, summary, rows, clients, state, stacked,
                       np.asarray(assignment_rounds) if stacked is not None else None,
                       embedding)
    for observer in observers:
        observer.finished(result)
    return result


def _restore(run_dir: Path, state, rounds_key, config: RunConfig, rows, round_seconds,
             evaluated_assignments, assignment_rounds) -> tuple[Any, int]:
    """Load `run_dir`'s checkpoint into the run's state and records (the lists, in place);
    returns the state and the last round it finished."""
    from mcfl import checkpoint

    saved = checkpoint.restore(run_dir, state, rounds_key)
    rows.extend(saved.progress["rows"])
    round_seconds.extend(saved.progress["round_seconds"])
    assignment_rounds.extend(saved.progress["assignment_rounds"])
    if saved.assignments is not None:
        evaluated_assignments.extend(np.asarray(saved.assignments))
    return saved.state, saved.round


def _divergence(config: RunConfig, row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """What a round with a non-finite metric says: which values, which rounds are kept, and
    the settings that scale the updates."""
    bad = ", ".join(f"{k}={v}" for k, v in row.items() if not math.isfinite(v))
    kept = f"rounds 1-{rows[-1]['round']} were kept" if rows else "no round was kept"
    causes = [f"--lr {config.lr}"]
    server_lr = getattr(config.params, "server_lr", None)
    if server_lr is not None:
        causes.append(f"--server-lr {server_lr}")
    return (f"training diverged in round {row['round']}: non-finite {bad}; {kept}. Try a "
            f"smaller {' or '.join(causes)}, or check the data for extreme values")


def _embedding(algorithm, config, hp, state, data, rounds_key, assignment,
               dataset) -> dict[str, np.ndarray]:
    """The 2-D projection of sampled clients' local models, with their clusters."""
    from mcfl.embedding import client_embedding

    count = min(config.embed_clients, dataset.num_clients)
    embed = jax.jit(functools.partial(client_embedding, algorithm, hp.training, count))
    found = jax.device_get(embed(state, data, jax.random.fold_in(rounds_key, config.rounds + 1)))
    clients = np.asarray(found.clients)
    out = {"clients": clients, "coords": np.asarray(found.coords),
           "explained": np.asarray(found.explained), "cluster": assignment[clients]}
    if dataset.true_cluster is not None:
        out["true_cluster"] = dataset.true_cluster[clients]
    return out


def round_chunks(rounds: int, eval_every: int, scanned: bool) -> list[tuple[int, int]]:
    """(first round, number of rounds) of each host call: one round at a time, or, scanned,
    the rounds up to each evaluation as one call (at most two lengths, so two compilations)."""
    if not scanned:
        return [(r, 1) for r in range(1, rounds + 1)]
    chunks = []
    first = 1
    while first <= rounds:
        end = min(-(-first // eval_every) * eval_every, rounds)
        chunks.append((first, end - first + 1))
        first = end + 1
    return chunks


def _one_round(algorithm, hp, state, data, rounds_key, r):
    """Round `r`, keyed ``fold_in(rounds_key, r)`` (as `scan_rounds` keys it); metrics [1]."""
    state, metrics = algorithm.round(state, data, jax.random.fold_in(rounds_key, r), hp)
    return state, jax.tree.map(lambda m: m[None], metrics)


class RoundRunner:
    """Runs `count` rounds from `first` as one host call, on programs compiled ahead of time:
    one jitted round, or (`scanned`) the rounds as one `lax.scan` (`scan_rounds`), compiled
    once per chunk length. The state is donated, so an algorithm that updates part of a large
    state (Local's [C, ...] models) does it in place instead of copying it every round."""

    def __init__(self, algorithm: FederatedAlgorithm, hp, scanned: bool, jit_options=None):
        jit_options = jit_options or {}  # out_shardings of a multi-process run
        if scanned:
            self._fn = jax.jit(functools.partial(scan_rounds, algorithm, hp),
                               static_argnums=(4,), donate_argnums=(0,), **jit_options)
        else:
            self._fn = jax.jit(functools.partial(_one_round, algorithm, hp),
                               donate_argnums=(0,), **jit_options)
        self._scanned = scanned
        self._compiled: dict[int, Any] = {}

    def _args(self, state, data, rounds_key, first, count):
        first = jnp.asarray(first, jnp.int32)
        return (state, data, rounds_key, first, count) if self._scanned else (
            state, data, rounds_key, first)

    def compile(self, state, data, rounds_key, count: int) -> None:
        if count not in self._compiled:
            lowered = self._fn.lower(*self._args(state, data, rounds_key, 1, count))
            self._compiled[count] = lowered.compile()

    def run(self, state, data, rounds_key, first: int, count: int):
        """(new state, metrics as NumPy arrays [count])."""
        self.compile(state, data, rounds_key, count)
        args = self._args(state, data, rounds_key, first, count)
        if self._scanned:
            args = args[:-1]  # the count is static: part of the compiled program
        with warnings.catch_warnings():
            # Buffers of state parts an algorithm rebuilds cannot be reused; that is fine.
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            state, metrics = self._compiled[count](*args)
        return state, jax.device_get(metrics)


class Evaluator:
    """Per-client test metrics of the models the algorithm assigns to each client, on a
    program compiled once."""

    def __init__(self, algorithm: FederatedAlgorithm, apply_fn, block_size: int,
                 jit_options=None):
        self._algorithm = algorithm
        self._fn = jax.jit(functools.partial(_evaluation_counts, algorithm, apply_fn,
                                             block_size), **(jit_options or {}))
        self._compiled = None

    def compile(self, state, dataset: FederatedDataset) -> None:
        if self._compiled is None:
            self._compiled = self._fn.lower(state, dataset.arrays).compile()

    def __call__(self, state, dataset: FederatedDataset):
        self.compile(state, dataset)
        counts, test_counts = jax.device_get(self._compiled(state, dataset.arrays))
        return client_metrics(counts, np.asarray(test_counts))


def _evaluation_counts(algorithm, apply_fn, block_size, state, data):
    models, index = algorithm.client_models(state)
    if index is None:
        index = jnp.zeros((data.num_clients,), jnp.int32)
    if algorithm.view is not None:
        data = algorithm.view(state, data)
    return engine.evaluate_counts(apply_fn, data, models, index, block_size), data.test_counts


def _summary(
    config, dataset, rows, round_seconds, started, params_count, per_round, block_size, status
) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "status": status,
        "config": config.to_dict(),
        "dataset": {
            "name": dataset.name,
            "clients": dataset.num_clients,
            "train_samples": int(dataset.train_counts().sum()),
            "test_samples": int(dataset.test_counts().sum()),
            "num_classes": dataset.num_classes,
        },
        "num_params": params_count,
        "clients_per_round": per_round,
        "block_size": block_size,
        "rounds_completed": len(rows),
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        "jax_version": jax.__version__,
    }
    summary.update(outcome(rows))
    for key in ("cluster_ari", "cluster_nmi", "num_clusters", "intra_cluster_distance"):
        if rows and key in rows[-1]:
            summary[key] = rows[-1][key]
    summary["wall_seconds"] = time.perf_counter() - started
    # Programs are compiled before round 1 (compile_seconds); round 1 still pays first-touch
    # costs (allocations), so the steady figure is the mean of the later rounds.
    steady = round_seconds[1:] or round_seconds
    summary["first_round_seconds"] = round_seconds[0] if round_seconds else None
    summary["seconds_per_round"] = float(np.mean(steady)) if steady else None
    return summary


def outcome(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run's rows come to (summary.json; a sweep member's line): "final" (the last
    evaluated round) and "best" (the highest over evaluated rounds) of each of `EVAL_KEYS`,
    the paper's score, the last training loss and the parameters sent in all."""
    evaluated = [row for row in rows if "accuracy_micro" in row]
    out: dict[str, Any] = {}
    for key in EVAL_KEYS:
        values = [row[key] for row in evaluated]
        out[f"final_{key}"] = values[-1] if values else None
        out[f"best_{key}"] = max(values) if values else None
    out[PAPER_SCORE] = paper_score(evaluated)
    out["final_train_loss"] = rows[-1]["train_loss"] if rows else None
    out["comm_params_total"] = rows[-1]["comm_params_total"] if rows else 0
    return out


def paper_score(evaluated: list[dict[str, Any]]) -> Optional[float]:
    """FlexCFL's score (Duan et al., Sec. 5.1): the best micro accuracy over the evaluated
    rounds at which every client is in a group (`clients_waiting` 0; algorithms without
    groups to join have every client in from round 1); None before that ever happens. Each
    client is scored with its group's current model, so a group is tested on its members."""
    scored = [row["accuracy_micro"] for row in evaluated
              if "accuracy_micro" in row and row.get("clients_waiting", 0) == 0]
    return max(scored) if scored else None


def add_communication(row: dict[str, Any], num_params: int, total_before: int) -> int:
    """Turn the round's model counts into parameters sent down and up (exact integers), with the
    running total; returns this round's parameters."""
    down = round(row["models_down"]) * num_params
    up = round(row["models_up"]) * num_params
    row.update(comm_params_down=down, comm_params_up=up,
               comm_params_total=total_before + down + up)
    return down + up


def cluster_metrics(assignment: np.ndarray, true_cluster: Optional[np.ndarray]) -> dict:
    """Cluster sizes (as text for the CSV) and, where the data has planted clusters, the
    adjusted Rand index and normalised mutual information against them (scikit-learn)."""
    sizes = np.bincount(assignment[assignment >= 0])  # -1: not yet in a cluster (FedGroup)
    out: dict[str, Any] = {"cluster_sizes": " ".join(str(int(n)) for n in sizes[sizes > 0]),
                           "clients_waiting": int(np.sum(assignment < 0))}
    if true_cluster is not None:
        from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

        out["cluster_ari"] = float(adjusted_rand_score(true_cluster, assignment))
        out["cluster_nmi"] = float(normalized_mutual_info_score(true_cluster, assignment))
    return out


def _client_rows(dataset: FederatedDataset, metrics, assignment=None) -> list[dict[str, Any]]:
    n_train = dataset.train_counts()
    rows = []
    for i, client_id in enumerate(dataset.client_ids):
        row = {
            "client_id": client_id,
            "n_train": int(n_train[i]),
            "n_test": int(metrics.n_test[i]),
            "accuracy": float(metrics.accuracy[i]),
            "f1": float(metrics.f1[i]),
        }
        if assignment is not None:
            row["cluster"] = int(assignment[i])
        if dataset.true_cluster is not None:
            row["true_cluster"] = int(dataset.true_cluster[i])
        rows.append(row)
    return rows
