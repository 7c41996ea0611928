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
from mcfl.errors import ConfigError, McflError, TrainingDivergedError
from mcfl.files import checkpoint, faults
from mcfl.files.checkpoint import Checkpoints, StopRequests
from mcfl.files.run_folder import RunTarget, check_target, write_settings
from mcfl.privacy import canaries
from mcfl.runs import records
from mcfl.runs.embedding import embedding_for_run
from mcfl.runs.execution import RunPlan, client_mesh, plan_run, run_keys
from mcfl.runs.folder import RunFolder, write_result
from mcfl.runs.loop import (
    UNSEEN_CLUSTER_KEYS,
    UNSEEN_GROUP_KEYS,
    UNSEEN_KEYS,
    LoopHooks,
    client_scores,
    run_rounds,
)
from mcfl.runs.plan import Plan, resolve
from mcfl.runs.program import RoundProgram
from mcfl.runs.records import MemberRecord
from mcfl.runs.resume import restore, resume_settings, resumed_config
from mcfl.runs.program import announce, run_program
from mcfl.runtime import distributed, memory
from mcfl.store import FOLDER as STORE_FOLDER
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
    model: Any = None,
    transform: Optional[MessageTransform] = None,
) -> RunResult:
    """Train `config` and return its results; write them under `out_dir` if given (through
    `mcfl.files.run_folder.RunFolder`), made once the data were loaded. A folder already holding a
    run is refused (`McflError`, before anything runs) unless `overwrite`: the new run then
    replaces the old one's files once it has its first checkpoint (`run_folder.RunTarget`).
    A run that cannot fit in memory is refused before it is built (`mcfl.runtime.memory`).

    A run with a folder keeps an orbax checkpoint in ``out_dir/checkpoints``
    (`mcfl.files.checkpoint`): every `checkpoint_every` rounds (default: every 5 minutes), at
    the end, and when SIGINT or SIGTERM stops it (at the end of the round, or of the scanned
    chunk, under way).
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
    hear about every round and the end (`RunObserver`). A prepared
    `dataset` may be passed to reuse it across runs (it must match the config's clients).
    With `cache_dir`, the prepared dataset is read from / written to that cache. With
    `profile_dir`, a jax.profiler trace of rounds 2-3 (compiled, steady state; round 1 if the
    run has one round; with scanned rounds, the second chunk of rounds) is written there
    for TensorBoard or Perfetto.
    """
    if resume is not None:
        settings = resume_settings(Path(resume))
        config, out_dir = resumed_config(config, from_dict(settings["config"]), Path(resume),
                                          out_dir, model)
        if checkpoint_every is None:  # the run keeps its own interval
            checkpoint_every = settings.get("checkpoint_every")
    elif config is None:
        raise ConfigError("run() needs a config, or resume=RUN_DIR to continue a stopped run")
    plan = resolve(config, model, transform, checkpoint_every)  # refused here: nothing built
    mesh = client_mesh(plan.execution.devices)
    writes = out_dir is not None and distributed.is_leader()
    if writes and resume is None:  # refused before anything runs; nothing made yet
        check_target(Path(out_dir), overwrite)
    started = time.perf_counter()
    plan, dataset = prepared_data(plan, dataset, cache_dir)
    run_plan = plan_run(plan, dataset)  # a model that does not fit the data: refused here
    # The data are ready: now the folder is made (or, replacing a run, its staging sibling).
    target = RunTarget(Path(out_dir)) if writes and resume is None else None
    folder = target.folder if target is not None else out_dir and Path(out_dir)
    if writes:
        write_settings(folder, plan.config.to_dict(), checkpoint_every, plan.describe())
    checkpoints = None
    if out_dir is not None and distributed.process_count() == 1:
        checkpoints = Checkpoints(folder, checkpoint_every)
    with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):
        observers = tuple(observers)
        if progress is not None:
            observers += (_Progress(progress),)
        run_folder = RunFolder(folder) if writes else None
        if run_folder is not None:
            observers += (run_folder,)
        if not distributed.is_leader():  # in a multi-process run, process 0 reports
            observers = ()

        def commit() -> None:  # a replacing run has its first checkpoint: swap it in
            if target is not None and target.pending:
                target.commit()
                run_folder.moved(target.folder)
                if checkpoints is not None:
                    checkpoints.move_to(target.folder)
                for moved in output.moved:
                    moved(target.folder)

        output = _Output(checkpoints, commit, replacing=target is not None and target.pending,
                         folder=folder if checkpoints is not None else None)
        try:
            return _run(plan, dataset, run_plan, started, observers, profile_dir, mesh, output,
                        None if resume is None else Path(resume))
        except BaseException as stop:
            replacing = target is not None and target.pending
            if target is not None:
                target.abandon()
            if replacing:  # a replacement that failed first: the old run stands
                if isinstance(stop, McflError) and stop.args:
                    stop.args = (f"{stop.args[0]}; the run it was to replace in "
                                 f"{str(target.out_dir)!r} is kept",)
            raise
        finally:
            if checkpoints is not None:
                checkpoints.close()


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
class _Output:
    """Where a run's checkpoints go, and for a run replacing another (--overwrite), the swap
    (`commit`) done once the new run has its first checkpoint."""

    checkpoints: Optional[Checkpoints] = None
    commit: Callable[[], None] = lambda: None
    replacing: bool = False
    folder: Optional[Path] = None  # the run's folder (a disk client store goes in it)
    moved: list = dataclasses.field(default_factory=list)  # callbacks(new folder) on commit


class _RunHooks(LoopHooks):
    """A run's side of the round loop: observers hear each row; the profiler traces the chunks
    in `profiled`; after a chunk, a checkpoint when due (always at the last round, after the
    first chunk of a replacing run, and when a signal asked to stop, which then stops the
    run). A second signal during the save stops the run after it."""

    def __init__(self, observers, profile_dir, profiled: range, save, output: _Output,
                 stop_requests: Optional[StopRequests], last_round: int):
        self.observers, self.profile_dir, self.profiled = observers, profile_dir, profiled
        self.save, self.output, self.stop_requests = save, output, stop_requests
        self.checkpoints = output.checkpoints
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
        if self.checkpoints is not None and (requested is not None or self.output.replacing
                                             or last_round == self.last_round
                                             or self.checkpoints.due(last_round)):
            with self.stop_requests.deferred():
                self.save(last_round, state)
        if self.output.replacing:
            self.output.commit()
            self.output.replacing = False
        if requested is not None:
            raise KeyboardInterrupt(f"signal {requested}")

    def stop_tracing(self) -> None:
        if self.tracing:
            jax.profiler.stop_trace()
            self.tracing = False


def _run(
    plan: Plan,
    dataset: FederatedDataset,
    run_plan: RunPlan,
    started: float,
    observers: tuple[RunObserver, ...] = (),
    profile_dir: Optional[str | Path] = None,
    mesh: Optional[jax.sharding.Mesh] = None,
    output: Optional[_Output] = None,
    resume_dir: Optional[Path] = None,
) -> RunResult:
    """Train `plan` on `dataset` (of the plan's clients) by `run_plan` (`run` checks both
    before the run folder is made)."""
    data = dataset.arrays
    init_key, rounds_key = run_keys(plan.seed)
    output = output or _Output()
    program, store = run_program(plan, run_plan, data, output.folder,
                                 jit_options=distributed.replicated_outputs(mesh))
    try:
        if store.kind != "device":
            output.moved.append(lambda folder: program.move_to(folder / STORE_FOLDER))
        run_plan = program.run_plan
        lengths = program.chunks.lengths()
        if plan.execution.checkpoint_every is not None and len(lengths) > 2:
            plan = dataclasses.replace(plan, notes=plan.notes + (chunk_note(plan, lengths),))
        compiled_before = program.compile_seconds  # (a kept program has compiled already)
        program.compile_init({}, init_key, data)
        label = f"{plan.algorithm.name} on {dataset.num_clients:,} clients"
        memory.check_program_fits(program.working_bytes(init=True), "its clients' state", label,
                                  plan.execution.devices, memory.resident_bytes(data))
        if program.start_streamed:  # said before the start, which trains every client
            announce(store)
        resuming = resume_dir is not None and checkpoint.exists(resume_dir)  # (else round 1)
        init_start = time.perf_counter()
        state = program.initial_state({}, init_key, data, resuming)
        init_seconds = time.perf_counter() - init_start
        privacy = run_plan.privacy
        probed = privacy is not None and privacy.mechanism.canaries > 0
        # (canaries: the global model before any round, kept before the state is donated)
        initial_model = jax.device_get(program.algorithm_state(state).params) if probed \
            else None
        record = MemberRecord()
        if privacy is not None:
            record.epsilons = privacy.epsilons(run_plan.rounds)
        chunks = program.chunks
        checkpoints = output.checkpoints
        if resuming:
            saved, done = restore(resume_dir, program.checkpoint_template(state), rounds_key,
                                  record)
            state = program.restored(saved)
            if checkpoints is not None:
                checkpoints.resumed_at(done)
            chunks = chunks.after(done)
        later = ()
        if program.clustered:  # cluster metrics arrive with evaluated rounds
            later = ("cluster_sizes", "clients_waiting") + (("cluster_ari", "cluster_nmi")
                                          if dataset.true_cluster is not None else ())
        if dataset.true_cluster is not None:  # (evaluated rounds: the planted groups')
            later += ("worst_group_accuracy", "smallest_group_accuracy")
        if dataset.unseen is not None:  # (evaluated rounds: the held-out clients')
            later += UNSEEN_KEYS
            if dataset.unseen.true_cluster is not None:
                later += UNSEEN_GROUP_KEYS + (UNSEEN_CLUSTER_KEYS if program.clustered else ())
        # Compile every program the run needs before the first round (from JAX's persistent cache
        # when it holds them), so that round times are training alone.
        program.compile_rounds({}, state, rounds_key, data)
        memory.check_program_fits(program.working_bytes(init=False), "a round", label,
                                  plan.execution.devices, memory.resident_bytes(data, state))
        if not program.start_streamed:  # said once the run is sure to start
            announce(store)
        for observer in observers:
            observer.started(plan.config, later)
            for row in record.rows:  # a resumed run's rows so far
                observer.round(row)

        def summary_with(status: str) -> dict[str, Any]:
            out = records.summary(plan, dataset, record, started, run_plan, status)
            return {**out, "init_seconds": init_seconds,
                    "compile_seconds": program.compile_seconds - compiled_before,
                    "low_rank": run_plan.low_rank, "devices": engine.client_shards(),
                    "notes": list(plan.notes),
                    "transform": program.transform.name,
                    "client_store": store.kind, "client_store_reason": store.reason}

        def save(last_round: int, state) -> None:
            checkpoints.save(last_round, program.checkpoint_state(last_round, state), rounds_key,
                             plan.config.to_dict(),
                             {"rows": record.rows, "round_seconds": record.round_seconds,
                              "assignment_rounds": record.assignment_rounds}, record.assignments)
            program.checkpointed()

        # Profile the first host calls after round 1: rounds 2-3, or the second scanned chunk.
        last = len(chunks) - 1
        many = program.scanned and any(count > 1 for _, count in chunks)
        profiled = range(min(1, last), min(1 if many else 2, last) + 1)
        # With checkpoints, SIGINT / SIGTERM stop the run at the end of a host call, where the
        # state is whole and can be checkpointed (mcfl.files.checkpoint.StopRequests).
        stop_requests = StopRequests() if checkpoints is not None else None
        hooks = _RunHooks(observers, profile_dir, profiled if profile_dir else range(0), save,
                          output, stop_requests, run_plan.rounds)
        try:
            with stop_requests or contextlib.nullcontext():
                state = run_rounds(program, dataset, state, {}, rounds_key, [record], chunks,
                                   hooks, keep=True)
            if not chunks:  # resumed after its last round's checkpoint: its final files are due
                record.client_metrics = client_scores(program, {}, state, dataset)
            if record.status == "diverged":
                raise TrainingDivergedError(records.divergence_message(plan, record.diverged_row,
                                                                       record.rows))
        except BaseException as stop:  # every stop leaves a summary with its status
            status = ("diverged" if isinstance(stop, TrainingDivergedError)
                      else "interrupted" if isinstance(stop, KeyboardInterrupt) else "error")
            for observer in observers:
                observer.stopped(summary_with(status))
            raise
        finally:
            hooks.stop_tracing()  # a run stopped inside the profiled rounds

        faults.point("finished")  # the last checkpoint is written, the final files not yet
        summary = summary_with("completed")
        if probed:
            summary.update(canary_summary(privacy, initial_model,
                                          jax.device_get(program.algorithm_state(state).params)))
        final_assignment = record.assignments[-1] if record.assignments else None
        clients = records.client_table(dataset, record.client_metrics, final_assignment)
        stacked = np.stack(record.assignments) if record.assignments else None
        embedding = None
        if program.clustered and plan.evaluation.embed_clients > 0:
            embedding = _embedding(program, store.kind, plan, state, data, rounds_key,
                                   final_assignment, dataset)
        result = RunResult(plan.config, summary, record.rows, clients,
                           program.algorithm_state(state), stacked,
                           np.asarray(record.assignment_rounds) if stacked is not None else None,
                           embedding, getattr(state, "rows", None))
        for observer in observers:
            observer.finished(result)
        return result
    finally:
        program.close()


def canary_summary(privacy, initial, final) -> dict[str, Any]:
    """summary.json's empirical check: the canaries' one-shot estimate beside the
    accountant's epsilon (`mcfl.privacy.canaries`)."""
    mechanism = privacy.mechanism
    found = canaries.estimate(initial, final, mechanism.canary_seed, mechanism.canaries,
                              privacy.delta)
    return {"dp_empirical_epsilon": found.epsilon, "dp_canaries": found.to_dict()}


def _embedding(program: RoundProgram, store_kind: str, plan: Plan, state, data,
               rounds_key, assignment, dataset: FederatedDataset) -> dict[str, np.ndarray]:
    """The 2-D projection of sampled clients' local models, with their clusters."""
    hp = program.hyperparams({}, private=False)
    run_plan = program.run_plan
    found, _ = embedding_for_run(
        program.algorithm, hp.training, plan.evaluation.embed_clients, run_plan.params_count,
        store_kind, None if program.stored is None else program.stored.folder,
        program.algorithm_state(state), data,
        jax.random.fold_in(rounds_key, plan.rounds + 1), run_plan.train_block)
    found = jax.device_get(found)
    clients = np.asarray(found.clients)
    out = {"clients": clients, "coords": np.asarray(found.coords),
           "explained": np.asarray(found.explained), "cluster": assignment[clients]}
    if dataset.true_cluster is not None:
        out["true_cluster"] = dataset.true_cluster[clients]
    return out
