"""`mcfl.run(config)`: build the data, model and algorithm a config names and train it.

A run is the one-member case of the round program (`mcfl.runs.program`) driven by the round loop
(`mcfl.runs.loop`) that sweeps use too. What is a run's own lives here: its folder and observers,
checkpoints and resume, the profiler, the final summary, clients.csv and the clients' 2-D
embedding. The training loop prints and writes nothing: it tells its observers
(`RunObserver`) about each round, the end and any stop, and a `progress` callback about each
round. `mcfl.run(config, out_dir=...)` adds the run-folder observer of `mcfl.files.run_folder`,
under which rounds.csv grows one row per round as the run goes, so a run that stops early
(NaN, Ctrl-C) keeps every round it finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np

from mcfl import engine
from mcfl.config import RunConfig, from_dict
from mcfl.data import FederatedDataset, resolve_data, with_held_out
from mcfl.data import load_dataset as load_data
from mcfl.errors import ConfigError, TrainingDivergedError
from mcfl.files import checkpoint, faults
from mcfl.files.checkpoint import Checkpoints
from mcfl.files.run_folder import write_settings
from mcfl.privacy import canaries
from mcfl.runs import records
from mcfl.runs.embedding import EmbeddingTraining, embedding_for_run
from mcfl.runs.execution import RunKeys, RunPlan, client_mesh, plan_run, run_keys
from mcfl.runs.folder import RunFolder, write_result
from mcfl.runs.lifecycle import Checkpointing, Destination, stop_signals
from mcfl.runs.loop import LoopHooks, RoundInputs, client_scores, later_columns, run_rounds
from mcfl.runs.plan import Plan, resolve
from mcfl.runs.program import RoundProgram, announce, run_program
from mcfl.runs.records import MemberRecord
from mcfl.runs.resume import restore, resume_settings, resumed_config
from mcfl.runtime import distributed, memory
from mcfl.store import FOLDER as STORE_FOLDER
from mcfl.store.choose import StoreChoice
from mcfl.transforms import MessageTransform


@dataclasses.dataclass
class RunResult:
    """Everything a run produced: what the output folder holds, as Python objects."""

    config: RunConfig
    summary: dict[str, Any]
    rounds: list[dict[str, Any]]
    clients: list[dict[str, Any]]
    state: Any  # the algorithm's final state
    # [E, C] cluster of every client after each evaluated round, and those rounds [E]
    assignments: Optional[np.ndarray] = None
    assignment_rounds: Optional[np.ndarray] = None
    # clustered runs: sampled clients' local models in 2-D (mcfl.runs.embedding), as NumPy arrays
    client_embedding: Optional[dict[str, np.ndarray]] = None
    # every client's row of the algorithm's per-client state [C, ...] (in the store's dtype)
    # when the device held them; None when it keeps none or a host or disk store held them
    rows: Any = None

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


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What `run` takes beside the config and the folder: ``mcfl.run(config, out_dir,
    **options)``.

    A run with a folder keeps an orbax checkpoint in ``out_dir/checkpoints``
    (`mcfl.files.checkpoint`): every `checkpoint_every` rounds (default: every 5 minutes), at
    the end, and when SIGINT or SIGTERM stops it (at the end of the round, or of the scanned
    chunk, under way). A folder already holding a run is refused unless `overwrite`: the new
    run then replaces the old one's files once it has its first checkpoint
    (`run_folder.RunTarget`).
    ``run(resume=RUN_DIR)`` continues the run stopped there, with the settings saved in its
    run.json (`config`, if given, must equal its config; `checkpoint_every` defaults to the
    run's), writing to RUN_DIR; its rounds and summary equal the uninterrupted run's apart from
    timings (`mcfl.runs.resume`).

    `model` trains a model of the user's instead of ``config.model``: a flax module whose
    ``__call__(x)`` returns logits, a factory ``(feature_shape, num_classes, **args) ->
    module``, or a `mcfl.models.ModelSpec` (`mcfl.models.make_model`); the run's config then
    records it as ``"python:NAME"``, and resuming it needs the same `model` again.

    `transform` (`mcfl.transforms`) is what every client message goes through between local
    training and the server's step, for any algorithm (default: none); the summary records its
    name, and resuming a run needs the same `transform` again.

    `progress(round, row)` is called after every round with that round's metrics; `observers`
    hear about every round and the end (`RunObserver`). A prepared `dataset` may be passed to
    reuse it across runs (it must match the config's clients). With `cache_dir`, the prepared
    dataset is read from / written to that cache. With `profile_dir`, a jax.profiler trace of
    rounds 2-3 (compiled, steady state; round 1 if the run has one round; with scanned
    rounds, the second chunk of rounds) is written there for TensorBoard or Perfetto.
    """

    progress: Optional[Callable[[int, dict], None]] = None
    dataset: Optional[FederatedDataset] = None
    cache_dir: Optional[str | Path] = None
    profile_dir: Optional[str | Path] = None
    observers: tuple[RunObserver, ...] = ()
    overwrite: bool = False
    resume: Optional[str | Path] = None
    checkpoint_every: Optional[int] = None
    model: Any = None
    transform: Optional[MessageTransform] = None


def options_of(kind: type, function: str, given: dict[str, Any]):
    """`given` keyword arguments of `function` as its options dataclass `kind`; a name it
    does not take is a TypeError naming it, as Python's own."""
    fields = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(given) - fields)
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}; it "
                        f"takes config, out_dir and {', '.join(sorted(fields))}")
    return kind(**given)


def run(config: Optional[RunConfig] = None, out_dir: Optional[str | Path] = None,
        **options) -> RunResult:
    """Train `config` and return its results; write them under `out_dir` if given (through
    `mcfl.files.run_folder.RunFolder`), made once the data were loaded. The `options` are
    `RunOptions`' fields (their docstring says what each does): resume, overwrite and
    checkpoints, a user's model and message transform, observers and progress, a prepared
    dataset, its cache, a profile. A folder already holding a run is refused (`McflError`,
    before anything runs) unless `overwrite`; a run that cannot fit in memory is refused
    before it is built (`mcfl.runtime.memory`)."""
    given = options_of(RunOptions, "run", options)
    config, out_dir, given = _settings(config, out_dir, given)
    plan = resolve(config, given.model, given.transform, given.checkpoint_every)
    mesh = client_mesh(plan.execution.devices)
    writes = out_dir is not None and distributed.is_leader()
    resume_dir = None if given.resume is None else Path(given.resume)
    destination = Destination(out_dir if writes else None, "run", given.overwrite,
                              resuming=resume_dir is not None)  # refused here: nothing made
    started = time.perf_counter()
    plan, dataset = prepared_data(plan, given.dataset, given.cache_dir)
    run_plan = plan_run(plan, dataset)  # a model that does not fit the data: refused here
    folder = destination.open()  # the data are ready: now the folder is made
    if writes:
        write_settings(folder, plan.config.to_dict(), given.checkpoint_every, plan.describe())
    checkpoints = None
    if folder is not None and distributed.process_count() == 1:
        checkpoints = Checkpoints(folder, given.checkpoint_every)
        destination.on_move(checkpoints.move_to)
    with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):
        observers = _observers(given, folder if writes else None, destination)
        session = _Session(plan, run_plan, dataset, started, mesh, destination, checkpoints)
        try:
            return _train(session, observers, given.profile_dir, resume_dir)
        except BaseException as stop:
            destination.abandon(stop)
            raise
        finally:
            if checkpoints is not None:
                checkpoints.close()


def _settings(config: Optional[RunConfig], out_dir, given: RunOptions):
    """(config, out_dir, options) of the run: a resumed run's from its run.json (`config`, if
    given, must equal its config; its checkpoint interval kept unless given)."""
    if given.resume is None:
        if config is None:
            raise ConfigError("run() needs a config, or resume=RUN_DIR to continue a stopped "
                              "run")
        return config, out_dir, given
    settings = resume_settings(Path(given.resume))
    config, out_dir = resumed_config(config, from_dict(settings["config"]), Path(given.resume),
                                     out_dir, given.model)
    if given.checkpoint_every is None:  # the run keeps its own interval
        given = dataclasses.replace(given, checkpoint_every=settings.get("checkpoint_every"))
    return config, out_dir, given


def _observers(given: RunOptions, folder: Optional[Path], destination: Destination
               ) -> tuple[RunObserver, ...]:
    """Who hears the run: the caller's observers, `progress`, and the run folder's writer
    (moved with the folder); in a multi-process run, process 0's alone."""
    if not distributed.is_leader():
        return ()
    observers = tuple(given.observers)
    if given.progress is not None:
        observers += (_Progress(given.progress),)
    if folder is not None:
        run_folder = RunFolder(folder)
        destination.on_move(run_folder.moved)
        observers += (run_folder,)
    return observers


def load_dataset(config: RunConfig, cache_dir: Optional[str | Path] = None
                 ) -> FederatedDataset:
    """The federated dataset `config` names (its data settings resolved into the
    `mcfl.data.DataSpec` a run's plan holds, through `mcfl.data.load_dataset`: from
    `cache_dir` when it was built before), without held-out clients (`--unseen-share` holds
    them out when a run starts). Only the data settings are resolved: one dataset serves a
    base config and the algorithms' variants of it."""
    return load_data(resolve_data(config.data, config.seed), cache_dir)


def prepared_data(plan: Plan, dataset: Optional[FederatedDataset] = None,
                  cache_dir: Optional[str | Path] = None) -> tuple[Plan, FederatedDataset]:
    """The plan's dataset (`dataset` if one was passed: it must hold the plan's clients), its
    clients held out by ``--unseen-share`` attached, and the plan for it: a natural dataset
    given no clients is loaded to count its users, and the plan resolved again with them. A
    dataset that cannot fit in memory is refused before it is built (`mcfl.runtime.memory`).
    Built outside any mesh: each process builds the same data from the plan and seed as plain
    (single-device) arrays; the rounds use them as replicated inputs."""
    if dataset is None:
        if plan.data.clients is not None:
            memory.check_data_fits(plan.data)
        dataset = load_data(plan.data, cache_dir)
        if plan.data.clients is None:
            plan = plan.with_clients(dataset.num_clients)
    elif plan.data.clients is None:
        plan = plan.with_clients(dataset.num_clients)
    if dataset.num_clients != plan.data.clients:
        raise ConfigError(
            f"the dataset passed has {dataset.num_clients} clients but the config says "
            f"clients={plan.data.clients}; build it from the same config")
    held = with_held_out(dataset, plan.data)  # (the clients that never train)
    if held.unseen is not None:
        plan = dataclasses.replace(plan, notes=plan.notes + (unseen_note(plan, dataset,
                                                                          held),))
    return plan, held


def chunk_note(plan: Plan, lengths: dict[int, int]) -> str:
    """What a checkpoint cadence beside the evaluation's costs scanned rounds: a chunk ends at
    each checkpoint and each evaluation, and each chunk length compiles once."""
    every, cadence = plan.evaluation.eval_every, plan.execution.checkpoint_every
    return (f"--checkpoint-every {cadence} beside --eval-every {every} cuts the scanned "
            f"rounds into chunks of {len(lengths)} lengths ({', '.join(map(str, sorted(lengths)))}"
            f"), each compiled once; a cadence that divides {every} or is a multiple of it "
            f"gives at most 2")


def unseen_note(plan: Plan, dataset: FederatedDataset, held: FederatedDataset) -> str:
    """What ``--unseen-share`` held out, said (its rounding: round(share x n) of each
    planted group of n clients, at least one in all, each group keeping one to train)."""
    share, count = plan.data.unseen_share, held.unseen.num_clients
    groups = "" if dataset.true_cluster is None else (
        f" (round({share:g} x n) of each of the {len(np.unique(dataset.true_cluster))} "
        f"planted groups of n clients)")
    return (f"--unseen-share {share:g} holds out {count} of the {dataset.num_clients} "
            f"clients{groups}: a share of {count / dataset.num_clients:.3g}")


@dataclasses.dataclass
class _Session:
    """One run under way: what its steps share (`_train`)."""

    plan: Plan
    run_plan: RunPlan
    dataset: FederatedDataset
    started: float  # (perf_counter at the start: the summary's wall time)
    mesh: Optional[jax.sharding.Mesh]
    destination: Destination
    checkpoints: Optional[Checkpoints]
    program: Optional[RoundProgram] = None
    store: Optional[StoreChoice] = None
    keys: RunKeys = None
    record: MemberRecord = dataclasses.field(default_factory=MemberRecord)
    compiled_before: float = 0.0  # (a kept program has compiled already)
    init_seconds: float = 0.0

    def summary(self, status: str) -> dict[str, Any]:
        """summary.json of the run as it stands, its `status` said."""
        plan, program, store = self.plan, self.program, self.store
        out = records.summary(plan, self.dataset, self.record, self.started, self.run_plan,
                              status)
        return {**out, "init_seconds": self.init_seconds,
                "compile_seconds": program.compile_seconds - self.compiled_before,
                "low_rank": self.run_plan.low_rank, "devices": engine.client_shards(),
                "notes": list(plan.notes), "transform": program.transform.name,
                "client_store": store.kind, "client_store_reason": store.reason}

    def save(self, last_round: int, state) -> None:
        """The checkpoint of round `last_round`: the state, the rows so far and the store's
        manifest."""
        record, program = self.record, self.program
        self.checkpoints.save(last_round, program.checkpoint_state(last_round, state),
                              self.keys.rounds, self.plan.config.to_dict(),
                              {"rows": record.rows, "round_seconds": record.round_seconds,
                               "assignment_rounds": record.assignment_rounds},
                              record.assignments)
        program.checkpointed()


class _Observed(LoopHooks):
    """A run's rows to its observers, and the profiler's trace of the chunks `profiled`."""

    def __init__(self, observers, profile_dir, profiled: range):
        self.observers, self.profile_dir, self.profiled = observers, profile_dir, profiled
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

    def stop_tracing(self) -> None:
        if self.tracing:
            jax.profiler.stop_trace()
            self.tracing = False


def _train(session: _Session, observers: tuple[RunObserver, ...], profile_dir,
           resume_dir: Optional[Path]) -> RunResult:
    """Train the session's plan: its program built, its state made (or restored), its rounds
    run, its result made; every stop leaves a summary with its status."""
    _build(session)
    try:
        state, chunks, initial_model = _initial(session, resume_dir)
        for observer in observers:
            observer.started(session.plan.config, later_columns(session.program,
                                                                session.dataset))
            for row in session.record.rows:  # a resumed run's rows so far
                observer.round(row)
        state = _rounds(session, state, chunks, observers, profile_dir)
        faults.point("finished")  # the last checkpoint is written, the final files not yet
        result = _result(session, state, initial_model)
        for observer in observers:
            observer.finished(result)
        return result
    finally:
        session.program.close()


def _build(session: _Session) -> None:
    """The session's program, over the client store its plan asks for (a disk store in the
    run's folder, moving with it)."""
    plan, destination = session.plan, session.destination
    folder = destination.folder if session.checkpoints is not None else None
    program, store = run_program(plan, session.run_plan, session.dataset.arrays, folder,
                                 jit_options=distributed.replicated_outputs(session.mesh))
    session.program, session.store = program, store
    session.run_plan = program.run_plan
    session.keys = RunKeys(*run_keys(plan.seed))
    session.compiled_before = program.compile_seconds
    if store.kind != "device":
        destination.on_move(lambda moved: program.move_to(moved / STORE_FOLDER))
    lengths = program.chunks.lengths()
    if plan.execution.checkpoint_every is not None and len(lengths) > 2:
        session.plan = dataclasses.replace(plan, notes=plan.notes + (chunk_note(plan,
                                                                                lengths),))


def _initial(session: _Session, resume_dir: Optional[Path]):
    """(state, chunks of rounds to run, the global model before any round when canaries
    probe it): the initial state, or a resumed run's restored; every program compiled first
    (from JAX's persistent cache when it holds them), so that round times are training
    alone."""
    program, data, plan = session.program, session.dataset.arrays, session.plan
    init_key, rounds_key = session.keys
    program.compile_init({}, init_key, data)
    label = f"{plan.algorithm.name} on {session.dataset.num_clients:,} clients"
    memory.check_program_fits(program.working_bytes(init=True), "its clients' state", label,
                              plan.execution.devices, memory.resident_bytes(data))
    if program.start_streamed:  # said before the start, which trains every client
        announce(session.store)
    resuming = resume_dir is not None and checkpoint.exists(resume_dir)  # (else round 1)
    init_start = time.perf_counter()
    state = program.initial_state({}, init_key, data, resuming)
    session.init_seconds = time.perf_counter() - init_start
    privacy = session.run_plan.privacy
    initial_model = None
    if privacy is not None and privacy.mechanism.canaries > 0:  # (before it is donated)
        initial_model = jax.device_get(program.algorithm_state(state).params)
    if privacy is not None:
        session.record.epsilons = privacy.epsilons(session.run_plan.rounds)
    chunks = program.chunks
    if resuming:
        saved, done = restore(resume_dir, program.checkpoint_template(state), rounds_key,
                              session.record)
        state = program.restored(saved)
        if session.checkpoints is not None:
            session.checkpoints.resumed_at(done)
        chunks = chunks.after(done)
    program.compile_rounds({}, state, rounds_key, data)
    memory.check_program_fits(program.working_bytes(init=False), "a round", label,
                              plan.execution.devices, memory.resident_bytes(data, state))
    if not program.start_streamed:  # said once the run is sure to start
        announce(session.store)
    return state, chunks, initial_model


def _rounds(session: _Session, state, chunks, observers, profile_dir):
    """Run `chunks` of rounds from `state`, checkpointed (`Checkpointing`) and stoppable by
    SIGINT / SIGTERM when the run has a folder; the final state."""
    program, record = session.program, session.record
    # Profile the first host calls after round 1: rounds 2-3, or the second scanned chunk.
    last = len(chunks) - 1
    many = program.scanned and any(count > 1 for _, count in chunks)
    profiled = range(min(1, last), min(1 if many else 2, last) + 1)
    observed = _Observed(observers, profile_dir, profiled if profile_dir else range(0))
    try:
        with stop_signals(session.checkpoints is not None) as stop_requests:
            hooks = Checkpointing(session.checkpoints, stop_requests, session.destination,
                                  session.save, session.run_plan.rounds, observed)
            state = run_rounds(program, session.dataset, state,
                               RoundInputs({}, session.keys.rounds),
                               [record], chunks, hooks, keep=True)
        if not chunks:  # resumed after its last round's checkpoint: its final files are due
            record.client_metrics = client_scores(program, {}, state, session.dataset)
        if record.status == "diverged":
            raise TrainingDivergedError(records.divergence_message(
                session.plan, record.diverged_row, record.rows))
    except BaseException as stop:  # every stop leaves a summary with its status
        status = ("diverged" if isinstance(stop, TrainingDivergedError)
                  else "interrupted" if isinstance(stop, KeyboardInterrupt) else "error")
        for observer in observers:
            observer.stopped(session.summary(status))
        raise
    finally:
        observed.stop_tracing()  # a run stopped inside the profiled rounds
    return state


def _result(session: _Session, state, initial_model) -> RunResult:
    """The completed run's `RunResult`: its summary (with the canaries' estimate), rows,
    clients, assignments and the clients' embedding."""
    program, plan, record, dataset = (session.program, session.plan, session.record,
                                      session.dataset)
    summary = session.summary("completed")
    if initial_model is not None:
        summary.update(canary_summary(session.run_plan.privacy, initial_model,
                                      jax.device_get(program.algorithm_state(state).params)))
    final_assignment = record.assignments[-1] if record.assignments else None
    clients = records.client_table(dataset, record.client_metrics, final_assignment)
    stacked = np.stack(record.assignments) if record.assignments else None
    embedding = None
    if program.clustered and plan.evaluation.embed_clients > 0:
        embedding = _embedding(program, plan, state, session.keys.rounds, final_assignment,
                               dataset)
    return RunResult(plan.config, summary, record.rows, clients,
                     program.algorithm_state(state), stacked,
                     np.asarray(record.assignment_rounds) if stacked is not None else None,
                     embedding, getattr(state, "rows", None))


def canary_summary(privacy, initial, final) -> dict[str, Any]:
    """summary.json's empirical check: the canaries' one-shot estimate beside the
    accountant's epsilon (`mcfl.privacy.canaries`)."""
    mechanism = privacy.mechanism
    found = canaries.estimate(initial, final, mechanism.canary_seed, mechanism.canaries,
                              privacy.delta)
    return {"dp_empirical_epsilon": found.epsilon, "dp_canaries": found.to_dict()}


def _embedding(program: RoundProgram, plan: Plan, state, rounds_key, assignment,
               dataset: FederatedDataset) -> dict[str, np.ndarray]:
    """The 2-D projection of sampled clients' local models, with their clusters."""
    hp = program.hyperparams({}, private=False)
    run_plan = program.run_plan
    found, _ = embedding_for_run(
        EmbeddingTraining(program.algorithm, hp.training, run_plan.train_block),
        plan.evaluation.embed_clients, run_plan.params_count, program.store_kind,
        None if program.stored is None else program.stored.folder,
        program.algorithm_state(state), dataset.arrays,
        jax.random.fold_in(rounds_key, plan.rounds + 1))
    found = jax.device_get(found)
    clients = np.asarray(found.clients)
    out = {"clients": clients, "coords": np.asarray(found.coords),
           "explained": np.asarray(found.explained), "cluster": assignment[clients]}
    if dataset.true_cluster is not None:
        out["true_cluster"] = dataset.true_cluster[clients]
    return out
