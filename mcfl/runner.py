"""`mcfl.run(config)`: build the data, model and algorithm a config names and train it.

A run is the one-member case of the round program (`mcfl.program`) driven by the round loop
(`mcfl.loop`) that sweeps use too. What is a run's own lives here: its folder and observers,
checkpoints and resume, the profiler, the final summary, clients.csv and the clients' 2-D
embedding. The training loop prints and writes nothing: it tells its observers
(`RunObserver`) about each round, the end and any stop, and a `progress` callback about each
round. `mcfl.run(config, out_dir=...)` adds the run-folder observer of `mcfl.run_folder`,
under which rounds.csv grows one row per round as the run goes, so a run that stops early
(NaN, Ctrl-C) keeps every round it finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np

from mcfl import checkpoint, distributed, engine, records
from mcfl.algorithms import hyperparams
from mcfl.checkpoint import Checkpoints, StopRequests, check_every
from mcfl.config import RunConfig, from_dict
from mcfl.data import FederatedDataset, load_dataset, with_all_users
from mcfl.embedding import client_embedding
from mcfl.errors import ConfigError, TrainingDivergedError
from mcfl.loop import LoopHooks, run_rounds
from mcfl.plan import client_mesh, plan_run, run_keys
from mcfl.program import RoundProgram, round_program
from mcfl.records import MemberRecord
from mcfl.run_folder import RunFolder, prepare_folder, write_result


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
    `mcfl.run_folder.RunFolder`). A folder already holding a run is refused (`McflError`,
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
    mesh = client_mesh(config.devices)
    if out_dir is not None and distributed.is_leader() and resume is None:
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


class _RunHooks(LoopHooks):
    """A run's side of the round loop: observers hear each row; the profiler traces the chunks
    in `profiled`; after a chunk, a checkpoint when due (always at the last round and when a
    signal asked to stop, which then stops the run)."""

    def __init__(self, observers, profile_dir, profiled: range, save, checkpoints,
                 stop_requests: Optional[StopRequests], last_round: int):
        self.observers, self.profile_dir, self.profiled = observers, profile_dir, profiled
        self.save, self.checkpoints, self.stop_requests = save, checkpoints, stop_requests
        self.last_round = last_round
        self.tracing = False

    def chunk_started(self, index: int) -> None:
        if index == self.profiled.start and index in self.profiled:
            jax.profiler.start_trace(str(self.profile_dir))
            self.tracing = True

    def row(self, member: int, row: dict[str, Any]) -> None:
        for observer in self.observers:
            observer.round(row)

    def chunk_finished(self, index: int, last_round: int, state) -> None:
        if self.tracing and index == self.profiled[-1]:
            self.stop_tracing()
        requested = None if self.stop_requests is None else self.stop_requests.requested
        if self.checkpoints is not None and (requested is not None
                                             or last_round == self.last_round
                                             or self.checkpoints.due(last_round)):
            self.save(last_round, state)
        if requested is not None:
            raise KeyboardInterrupt(f"signal {requested}")

    def stop_tracing(self) -> None:
        if self.tracing:
            jax.profiler.stop_trace()
            self.tracing = False


def _run(
    config: RunConfig,
    dataset: FederatedDataset,
    started: float,
    observers: tuple[RunObserver, ...] = (),
    profile_dir: Optional[str | Path] = None,
    mesh: Optional[jax.sharding.Mesh] = None,
    checkpoints: Optional[Checkpoints] = None,
    resume_dir: Optional[Path] = None,
) -> RunResult:
    if dataset.num_clients != config.clients:
        raise ConfigError(
            f"the dataset passed has {dataset.num_clients} clients but the config says "
            f"clients={config.clients}; build it from the same config"
        )
    data = dataset.arrays
    init_key, rounds_key = run_keys(config.seed)
    program = round_program(config, plan_run(config, dataset), data,
                            jit_options=distributed.replicated_outputs(mesh))
    plan = program.plan
    compiled_before = program.compile_seconds  # (a kept program has compiled already)
    program.compile_init({}, init_key, data)
    init_start = time.perf_counter()
    state = program.init({}, init_key, data)
    init_seconds = time.perf_counter() - init_start
    record = MemberRecord()
    chunks = program.chunks
    if resume_dir is not None:
        state, done = _restore(resume_dir, state, rounds_key, record)
        chunks = [(first, count) for first, count in chunks if first > done]
    later = ()
    if program.clustered:  # cluster metrics arrive with evaluated rounds
        later = ("cluster_sizes", "clients_waiting") + (("cluster_ari", "cluster_nmi")
                                      if dataset.true_cluster is not None else ())
    for observer in observers:
        observer.started(config, later)
        for row in record.rows:  # a resumed run's rows so far
            observer.round(row)
    # Compile every program the run needs before the first round (from JAX's persistent cache
    # when it holds them), so that round times are training alone.
    program.compile_rounds({}, state, rounds_key, data)

    def summary_with(status: str) -> dict[str, Any]:
        out = records.summary(config, dataset, record, started, plan, status)
        return {**out, "init_seconds": init_seconds,
                "compile_seconds": program.compile_seconds - compiled_before,
                "low_rank": plan.low_rank, "devices": engine.client_shards()}

    def save(last_round: int, state) -> None:
        checkpoints.save(last_round, state, rounds_key, config.to_dict(),
                         {"rows": record.rows, "round_seconds": record.round_seconds,
                          "assignment_rounds": record.assignment_rounds}, record.assignments)

    # Profile the first host calls after round 1: rounds 2-3, or the second scanned chunk.
    last = len(chunks) - 1
    profiled = range(min(1, last), min(1 if config.scan_rounds else 2, last) + 1)
    # With checkpoints, SIGINT / SIGTERM stop the run at the end of a host call, where the
    # state is whole and can be checkpointed (mcfl.checkpoint.StopRequests).
    stop_requests = StopRequests() if checkpoints is not None else None
    hooks = _RunHooks(observers, profile_dir, profiled if profile_dir else range(0), save,
                      checkpoints, stop_requests, config.rounds)
    try:
        with stop_requests or contextlib.nullcontext():
            state = run_rounds(program, config, dataset, state, {}, rounds_key, [record], chunks,
                               hooks, keep=True)
        if record.status == "diverged":
            raise TrainingDivergedError(records.divergence_message(config, record.diverged_row,
                                                                   record.rows))
    except BaseException as stop:  # every stop leaves a summary with its status
        status = ("diverged" if isinstance(stop, TrainingDivergedError)
                  else "interrupted" if isinstance(stop, KeyboardInterrupt) else "error")
        for observer in observers:
            observer.stopped(summary_with(status))
        raise
    finally:
        hooks.stop_tracing()  # a run stopped inside the profiled rounds

    summary = summary_with("completed")
    final_assignment = record.assignments[-1] if record.assignments else None
    clients = records.client_rows(dataset, record.client_metrics, final_assignment)
    stacked = np.stack(record.assignments) if record.assignments else None
    embedding = None
    if program.clustered and config.embed_clients > 0:
        embedding = _embedding(program, config, state, data, rounds_key, final_assignment,
                               dataset)
    result = RunResult(config, summary, record.rows, clients, state, stacked,
                       np.asarray(record.assignment_rounds) if stacked is not None else None,
                       embedding)
    for observer in observers:
        observer.finished(result)
    return result


def _restore(run_dir: Path, state, rounds_key, record: MemberRecord) -> tuple[Any, int]:
    """Load `run_dir`'s checkpoint into the run's state and `record`; returns the state and
    the last round it finished."""
    saved = checkpoint.restore(run_dir, state, rounds_key)
    record.rows.extend(saved.progress["rows"])
    record.round_seconds.extend(saved.progress["round_seconds"])
    record.assignment_rounds.extend(saved.progress["assignment_rounds"])
    if saved.assignments is not None:
        record.assignments.extend(np.asarray(saved.assignments))
    record.comm_total = record.rows[-1]["comm_params_total"] if record.rows else 0
    return saved.state, saved.round


def _embedding(program: RoundProgram, config: RunConfig, state, data, rounds_key, assignment,
               dataset: FederatedDataset) -> dict[str, np.ndarray]:
    """The 2-D projection of sampled clients' local models, with their clusters."""
    count = min(config.embed_clients, dataset.num_clients)
    hp = hyperparams(config, program.plan.model)
    embed = jax.jit(functools.partial(client_embedding, program.algorithm, hp.training, count))
    with engine.planned_block_size(program.plan.train_block):
        found = jax.device_get(embed(state, data,
                                     jax.random.fold_in(rounds_key, config.rounds + 1)))
    clients = np.asarray(found.clients)
    out = {"clients": clients, "coords": np.asarray(found.coords),
           "explained": np.asarray(found.explained), "cluster": assignment[clients]}
    if dataset.true_cluster is not None:
        out["true_cluster"] = dataset.true_cluster[clients]
    return out
