"""`mcfl.sweep`: many seeds and hyperparameter values of one experiment, vmapped.

``mcfl.sweep(config, seeds=8, grid={"lr": [0.01, 0.05], "mu": [0.0, 0.1]})`` runs every grid
point with every seed. Members that differ only in their seed and in traced settings (floats
no shape depends on) run as one compiled program over a member axis, sharing one copy of the
data (`mcfl.sweeps.members`); the rest (algorithm, model, clients, K, ...) split the sweep into
groups run one after another (`mcfl.sweeps.spec`). Results are tidy tables
(`mcfl.sweeps.tables`): per member and round, per member, and per grid point as mean, std and
95% interval over seeds.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import jax

from mcfl.config import RunConfig, from_dict
from mcfl.data import FederatedDataset, load_dataset, resolve_data, with_held_out
from mcfl.errors import ConfigError
from mcfl.files import atomic, checkpoint
from mcfl.files.checkpoint import Checkpoints, StopRequests, check_every
from mcfl.files.run_folder import recover_replacement
from mcfl.models.build import model_label
from mcfl.runs.execution import client_mesh, plan_run
from mcfl.runs.lifecycle import Checkpointing, Destination, stop_signals
from mcfl.runs.loop import LoopHooks, RoundInputs, later_columns, run_rounds
from mcfl.runs.plan import Plan, resolve
from mcfl.runs.program import MemberAxis, RoundProgram, member_mesh, run_program
from mcfl.runs.records import MemberRecord
from mcfl.runs.resume import differences
from mcfl.runs.runner import options_of
from mcfl.runtime import distributed
from mcfl.sweeps import folder as sweep_folder
from mcfl.sweeps import tables
from mcfl.sweeps.members import default_width, fit, member_keys, memory_budget, padded
from mcfl.sweeps.observed import Followers, check_factories
from mcfl.sweeps.spec import (
    Group,
    Member,
    check_grid,
    check_settings_taken,
    expand,
    group,
    parse_seeds,
)
from mcfl.transforms import IDENTITY

__all__ = ["SweepResult", "sweep"]


@dataclasses.dataclass
class SweepResult:
    """A sweep's tables (lists of dicts; `frames()` gives pandas DataFrames) and its spec."""

    spec: dict[str, Any]
    members: list[dict[str, Any]]
    rounds: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    groups: list[dict[str, Any]]

    @property
    def point_names(self) -> list[str]:
        return list(self.spec["grid"])

    def frames(self) -> dict[str, Any]:
        """{"members", "rounds", "summary"} as pandas DataFrames (needs pandas)."""
        import pandas as pd

        return {name: pd.DataFrame(getattr(self, name))
                for name in ("members", "rounds", "summary")}

    def write(self, out_dir) -> Path:
        """members.csv, rounds.csv, summary.csv, sweep.json and curves.png in `out_dir`."""
        out = Path(out_dir)
        sweep_folder.write_tables(out, {**self.spec, "groups_run": self.groups}, self.members,
                                  self.rounds, self.summary, self.point_names, final=True)
        return out


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """What `sweep` takes beside the config, the seeds and the grid: ``mcfl.sweep(config,
    seeds, grid, **options)``. One dataset is shared (the config's data seed) unless
    `data_seeds` lists several, each its own group.

    Members of a group run as one compiled program, in chunks of at most `members_per_chunk`
    (default: as many as fit in memory); `member_width` of them side by side (vmapped), the
    rest one after another inside the same program ("auto": 1 on CPU, all on GPU / TPU, see
    `mcfl.sweeps.members.default_width`; None: all). `progress(done, total)` counts
    member-rounds. Every member's rows equal ``mcfl.run`` of its config (the member table's
    seed, data seed and grid values on `config`) to float rounding. `model` trains a user's
    flax module (or factory, or `mcfl.models.ModelSpec`) in every member, as in `mcfl.run`;
    so does `transform`, what every client message goes through (`mcfl.transforms`).

    With `out_dir`, sweep.json is written at the start and the tables after every chunk
    (`mcfl.sweeps.folder`), and the chunk under way keeps a checkpoint every
    `checkpoint_every` rounds (default: every 5 minutes), and when SIGINT / SIGTERM stops
    it. A folder holding a sweep is refused unless `overwrite`, and the new sweep replaces it
    only once it has its first checkpoint; a folder holding anything else is refused.
    ``sweep(resume=FOLDER)`` finishes the sweep stopped there with its own spec (`config`,
    if given, must equal it; pass `model`, `dataset` and `transform` again if it had them):
    finished members are read back, the chunk under way continues from its checkpoint, and
    the tables equal the uninterrupted sweep's (apart from timings). A completed sweep is
    read back as it is.

    `observers` follow each member as a run of its own: each makes the member's
    `mcfl.RunObserver` (``observer.member(member, spec)``, `mcfl.sweeps.observed`), as the
    trackers of `mcfl.tracking` do (one tracking run per member, grouped by grid point).
    """

    data_seeds: Optional[Sequence[int]] = None
    out_dir: Optional[str | Path] = None
    cache_dir: Optional[str | Path] = None
    members_per_chunk: Optional[int] = None
    member_width: Optional[int] | str = "auto"
    progress: Optional[Callable[[int, int], None]] = None
    dataset: Optional[FederatedDataset] = None
    overwrite: bool = False
    model: Any = None
    observers: Sequence[Any] = ()
    transform: Optional[Any] = None
    resume: Optional[str | Path] = None
    checkpoint_every: Optional[int] = None


def sweep(config: Optional[RunConfig] = None, seeds: int | Sequence[int] | str = 1,
          grid: Optional[Mapping[str, Sequence[Any]]] = None, **options) -> SweepResult:
    """Run every combination of `grid` ({config key: [values]}, ``algorithm`` included) with
    every seed (a list, a count n for 0..n-1, or text like "0-7"). The `options` are
    `SweepOptions`' fields (their docstring says what each does). Every member's rows equal
    ``mcfl.run`` of its config (the member table's seed, data seed and grid values on
    `config`) to float rounding."""
    if distributed.process_count() > 1:
        raise ConfigError("a sweep runs in one process (over all its devices); start it "
                          "without --coordinator")
    study = _study(config, seeds, grid, options_of(SweepOptions, "sweep", options))
    if study.saved is not None and _finished_before(study):
        return _read_back(study.spec, study.saved, study.members, study.finished)
    destination = Destination(study.out, "sweep", study.given.overwrite,
                              resuming=study.saved is not None)
    # Bad data, or a model that fails on them, are refused before any file is made.
    run_plans = {g: plan_run(study.plans[grp.members[0].index],
                             study.dataset_for(study.plans[grp.members[0].index]))
                 for g, grp in enumerate(study.groups) if not study.done(grp.members)}
    folder = destination.open()
    client_mesh(study.config.devices)  # checks the device count
    result = SweepResult(study.spec, [], [], [], [])
    # Each group's record (its chunk size above all: a resumed sweep cuts the same chunks).
    group_runs = {g["group"]: g for g in (study.saved or {}).get("groups_run", [])}
    result.groups = [group_runs[g] for g in sorted(group_runs)]
    writer = _Writer(folder, result, study.members, study.finished)
    destination.on_move(writer.moved)
    writer.write(final=False)  # sweep.json first: the folder says what it is from the start
    total = sum(m.config.rounds for m in study.members)  # (rounds may be on the grid)
    counter = _Counter(study.given.progress, total, sum(
        m.config.rounds for m in study.members if m.index in study.finished))
    chunks = _ChunkCheckpoints(destination, study.checkpoint_every)
    status = "completed"
    try:
        with stop_signals(folder is not None) as stop_requests:
            running = _Running(study, destination, writer, counter, chunks, stop_requests,
                               group_runs)
            for g, grp in enumerate(study.groups):
                if not study.done(grp.members):
                    _run_group(running, g, grp, run_plans[g])
    except BaseException as stop:
        status = "interrupted" if isinstance(stop, KeyboardInterrupt) else "error"
        if destination.replacing:  # a replacement stopped before its start: nothing kept
            writer.folder = None
        destination.abandon(stop)
        raise
    finally:
        for program in study.programs:  # a disk store's temporary folder goes
            program.close()
        chunks.close()
        study.spec.update(status=status, wall_seconds=counter.seconds(),
                          backend=jax.default_backend(), devices=len(jax.devices()),
                          jax_version=jax.__version__)
        writer.write(final=status == "completed")
    destination.commit()  # (a sweep that finished before its first checkpoint)
    return result


def _finished_before(study: _Study) -> bool:
    """A resumed sweep's members finished before (read back into `study.finished`), and
    whether that is all of them in a completed sweep."""
    saved = study.saved
    if saved.get("transform", IDENTITY.name) != study.spec["transform"]:
        raise ConfigError(f"the sweep in {str(study.out)!r} ran with the message transform "
                          f"{saved.get('transform')!r}; resume it with the same one "
                          f"(given: {study.spec['transform']!r})")
    atomic.remove_temporaries(study.out)
    study.finished.update(sweep_folder.finished_records(study.out, study.members))
    return saved.get("status") == "completed" and len(study.finished) == len(study.members)


@dataclasses.dataclass
class _Study:
    """A sweep's settings as resolved (`_study`): its members, their plans and groups, its
    spec (sweep.json), and what it has done (`finished`, the `programs` built)."""

    config: RunConfig
    given: SweepOptions
    members: list[Member]
    plans: dict[int, Plan]
    groups: list[Group]
    spec: dict[str, Any]
    out: Optional[Path]
    saved: Optional[dict[str, Any]]
    checkpoint_every: Optional[int]
    member_width: Optional[int]
    members_per_chunk: Optional[int]
    finished: dict[int, MemberRecord] = dataclasses.field(default_factory=dict)
    programs: list[RoundProgram] = dataclasses.field(default_factory=list)
    datasets: dict[tuple, FederatedDataset] = dataclasses.field(default_factory=dict)

    def done(self, members: Sequence[Member]) -> bool:
        return all(m.index in self.finished for m in members)

    def dataset_for(self, plan: Plan) -> FederatedDataset:
        return _dataset_for(plan, self.datasets, self.given.dataset, self.given.cache_dir)


def _study(config: Optional[RunConfig], seeds, grid, given: SweepOptions) -> _Study:
    """The sweep's `_Study`: its settings checked (a resumed sweep's from its sweep.json),
    its members expanded, each planned as its own run would be."""
    saved, out_dir = None, given.out_dir
    seeds_, grid_, data_seeds = seeds, grid, given.data_seeds
    per_chunk, width, every = given.members_per_chunk, given.member_width, given.checkpoint_every
    if given.resume is not None:
        resume = Path(given.resume)
        if out_dir is not None and Path(out_dir).resolve() != resume.resolve():
            raise ConfigError(f"a resumed sweep writes to its own folder {str(resume)!r}, not "
                              f"{str(out_dir)!r}")
        if given.overwrite:
            raise ConfigError("resume and overwrite contradict each other: pick one")
        recover_replacement(resume)  # (a replacement a kill cut short in its swap)
        saved = sweep_folder.read_spec(resume)
        config, seeds_, grid_, data_seeds, per_chunk, width, every = _resumed_settings(
            saved, config, resume, every)
        out_dir = resume
    elif config is None:
        raise ConfigError("sweep() needs a config, or resume=FOLDER to finish a stopped sweep")
    if given.model is not None:
        config = config.replace(model=model_label(given.model))
    check_every(every)
    seeds_, grid_ = parse_seeds(seeds_), check_grid(grid_)
    given = dataclasses.replace(given, observers=check_factories(given.observers))
    _check_chunking(per_chunk, width)
    width = default_width() if width == "auto" else width
    if data_seeds is not None:
        data_seeds = parse_seeds(data_seeds, what="data_seeds")  # (a count, a list or text)
    config = _with_clients(config, given)
    members = expand(config, seeds_, grid_, data_seeds)
    check_settings_taken(config, (m.config.algorithm for m in members))
    plans = member_plans(members, given.model, given.transform, every)
    groups = group(members)
    spec = {"config": config.to_dict(), "seeds": list(seeds_), "grid":
            {k: list(v) for k, v in grid_.items()},
            "data_seeds": None if data_seeds is None else list(data_seeds),
            "members": len(members), "groups": len(groups), "member_width": width,
            "members_per_chunk": per_chunk, "checkpoint_every": every,
            "transform": (given.transform or IDENTITY).name}
    return _Study(config, given, members, plans, groups, spec,
                  None if out_dir is None else Path(out_dir), saved, every, width, per_chunk)


def _check_chunking(members_per_chunk, member_width) -> None:
    """`members_per_chunk`: None or an integer >= 1; `member_width`: also "auto"."""
    if members_per_chunk is not None and (isinstance(members_per_chunk, bool) or not
                                          isinstance(members_per_chunk, int)
                                          or members_per_chunk < 1):
        raise ConfigError(f"members_per_chunk must be an integer >= 1, got "
                          f"{members_per_chunk!r}")
    if member_width not in ("auto", None) and (isinstance(member_width, bool) or not
                                               isinstance(member_width, int)
                                               or member_width < 1):
        raise ConfigError(f"member_width must be 'auto', None or an integer >= 1, got "
                          f"{member_width!r}")


def _with_clients(config: RunConfig, given: SweepOptions) -> RunConfig:
    """`config` with its clients counted: a natural dataset (leaf) given none has all its
    users."""
    if config.clients is not None:
        return config
    if given.dataset is not None:
        return config.replace(clients=given.dataset.num_clients)
    users = load_dataset(resolve_data(config.data, config.seed), given.cache_dir)
    return config.replace(clients=users.num_clients)


def _resumed_settings(saved: dict[str, Any], config: Optional[RunConfig], folder: Path,
                      checkpoint_every: Optional[int]) -> tuple:
    """The settings of the sweep in `folder` from its sweep.json (`config`, if given, must
    equal its config)."""
    own = from_dict(saved["config"])
    if config is not None and config.to_dict() != own.to_dict():
        raise ConfigError(f"the config differs from the sweep's in {str(folder)!r}: "
                          + differences(config, own, "sweep.json")
                          + "; a sweep resumes with its own config")
    return (own, saved["seeds"], saved.get("grid") or {}, saved.get("data_seeds"),
            saved.get("members_per_chunk"), saved.get("member_width"),
            checkpoint_every if checkpoint_every is not None else saved.get("checkpoint_every"))


def _read_back(spec, saved, members, finished) -> SweepResult:
    """A completed sweep's result, from its folder."""
    spec = {**spec, **{k: saved[k] for k in ("status", "wall_seconds", "backend", "devices",
                                              "jax_version") if k in saved}}
    result = SweepResult(spec, [], [], [], list(saved.get("groups_run", [])))
    _fill(result, members, finished)
    return result


class _Counter:
    """Member-rounds done, told to `progress(done, total)`; the sweep's wall time."""

    def __init__(self, progress, total: int, done: int):
        self.progress, self.total, self.done = progress, total, done
        self.started = time.perf_counter()

    def tick(self, count: int) -> None:
        self.done += count
        if self.progress is not None:
            self.progress(self.done, self.total)

    def seconds(self) -> float:
        return time.perf_counter() - self.started


class _Writer:
    """The sweep's folder (None: no folder): its tables rebuilt from the finished members."""

    def __init__(self, folder: Optional[Path], result: SweepResult, members: list[Member],
                 finished: dict[int, MemberRecord]):
        self.folder, self.result, self.members, self.finished = folder, result, members, finished

    def write(self, final: bool) -> None:
        _fill(self.result, self.members, self.finished)
        if self.folder is None:
            return
        pending = sweep_folder.pending_members(self.members, self.finished)
        spec = {**self.result.spec, "status": self.result.spec.get("status", "running"),
                "pending_members": pending, "groups_run": self.result.groups}
        sweep_folder.write_tables(self.folder, spec, self.result.members, self.result.rounds,
                                  self.result.summary, self.result.point_names, final)

    def moved(self, folder: Path) -> None:
        self.folder = folder


class _ChunkCheckpoints:
    """The checkpoints of the chunk of members under way, in the sweep's folder (None: no
    folder, no checkpoints); moved with the folder when a replacing sweep swaps in."""

    def __init__(self, destination: Destination, every: Optional[int]):
        self.destination, self.every = destination, every
        self.current: Optional[Checkpoints] = None
        destination.on_move(self._moved)

    def start(self) -> Optional[Checkpoints]:
        """A chunk starts: its checkpoints (the folder may hold its earlier one)."""
        if self.destination.folder is None:
            return None
        self.current = Checkpoints(self.destination.folder, self.every)
        return self.current

    def done(self) -> None:
        """The chunk's members are in the tables: its checkpoint is no longer needed."""
        self.close()
        if self.destination.folder is not None:
            shutil.rmtree(self.destination.folder / checkpoint.FOLDER, ignore_errors=True)

    def _moved(self, folder: Path) -> None:
        if self.current is not None:
            self.current.move_to(folder)

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None


@dataclasses.dataclass
class _Running:
    """What the groups and chunks of a running sweep share."""

    study: _Study
    destination: Destination
    writer: _Writer
    counter: _Counter
    checkpoints: _ChunkCheckpoints
    stop_requests: Optional[StopRequests]
    group_runs: dict[int, dict[str, Any]]

    @property
    def devices(self) -> int:
        return self.study.config.devices or len(jax.devices())


@dataclasses.dataclass
class _GroupRun:
    """One group's compiled program, data, chunk size and record (groups_run in
    sweep.json)."""

    index: int
    group: Group
    program: RoundProgram
    dataset: FederatedDataset
    size: int
    info: dict[str, Any]


def _run_group(running: _Running, g: int, grp: Group, run_plan) -> None:
    """Run group `g`'s unfinished members, chunk by chunk, in one compiled program; the
    tables written after each chunk."""
    study = running.study
    base = study.plans[grp.members[0].index]
    data = study.dataset_for(base)
    program, _ = run_program(base, run_plan, data.arrays, None, MemberAxis(
        grp.traced, len(grp.members), member_mesh(running.devices), study.member_width))
    study.programs.append(program)
    compiled_before = program.compile_seconds  # (a kept program: compiled already)
    chunk_size = running.group_runs.get(g, {}).get("members_per_chunk",
                                                   study.members_per_chunk)
    size = fit(program, grp.members, data.arrays, memory_budget(), running.devices,
               chunk_size)
    info = {"group": g, "members": len(grp.members), "traced": list(grp.traced),
            "members_per_chunk": size, "member_width": study.member_width,
            "compile_seconds": program.compile_seconds - compiled_before,
            "settings": _group_settings(grp), "init_seconds": 0.0}
    running.group_runs[g] = info
    running.writer.result.groups = [running.group_runs[k] for k in sorted(running.group_runs)]
    running.writer.write(final=False)  # (the chunk size, for a resumed sweep's chunks)
    running.counter.tick(0)
    t0 = time.perf_counter()
    group_run = _GroupRun(g, grp, program, data, size, info)
    for start in range(0, len(grp.members), size):
        chunk = list(grp.members[start:start + size])
        if study.done(chunk):
            continue
        records = _run_chunk(running, group_run, start, chunk)
        for m, record in zip(chunk, records):
            study.finished.setdefault(m.index, record)  # (one read back stays)
        running.writer.write(final=False)
        running.checkpoints.done()
    info["run_seconds"] = time.perf_counter() - t0


class _Counted(LoopHooks):
    """A chunk's member-rounds counted as its chunks of rounds finish; each member's rows to
    its observers (`followers`)."""

    def __init__(self, chunks, members: int, counter: _Counter, followers: Followers):
        self.chunks, self.members, self.counter = chunks, members, counter
        self.followers = followers

    def row(self, member: int, row: dict[str, Any]) -> None:
        self.followers.row(member, row)

    def chunk_finished(self, index: int, last_round: int, state) -> None:
        self.counter.tick(self.chunks[index][1] * self.members)  # members share the rounds


def _run_chunk(running: _Running, group_run: _GroupRun, start: int, chunk: list[Member]
               ) -> list[MemberRecord]:
    """Train `chunk`'s members (padded to the group's chunk size) through every round, from
    the chunk's checkpoint if the folder holds one: their records (and their observers told
    of their start and end)."""
    program, dataset = group_run.program, group_run.dataset
    members = padded(chunk, group_run.size)
    values = program.values([m.config for m in members])
    init_keys, rounds_keys = member_keys(members)
    t0 = time.perf_counter()
    state = program.init(values, init_keys, dataset.arrays)
    group_run.info["init_seconds"] += time.perf_counter() - t0
    records = [MemberRecord() for _ in members]
    _spend_privacy(program, members, records)
    place = {"group": group_run.index, "first": start, "members": [m.index for m in members]}
    chunks = program.chunks
    checkpoints = running.checkpoints.start()
    folder = running.destination.folder
    if checkpoints is not None and checkpoint.exists(folder):
        resumed = _restore(folder, place, state, rounds_keys, records)
        if resumed is not None:
            state, done = resumed
            checkpoints.resumed_at(done)
            chunks = chunks.after(done)
            running.counter.tick(done * len(chunk))
        else:  # another chunk's (finished, or from a sweep since changed): not this one's
            shutil.rmtree(folder / checkpoint.FOLDER, ignore_errors=True)

    def save(last_round: int, state) -> None:
        checkpoints.save(last_round, state, rounds_keys, group_run.group.base.to_dict(),
                         {**place, "records": [_progress(r) for r in records]}, [])

    followers = Followers(running.study.given.observers, chunk, running.study.spec)
    hooks = Checkpointing(checkpoints, running.stop_requests, running.destination, save, None,
                          _Counted(chunks, len(chunk), running.counter, followers))
    followers.started(later_columns(program, dataset))
    for m, record in enumerate(records):  # a resumed chunk's rows so far
        for row in record.rows:
            followers.row(m, row)
    try:
        run_rounds(program, dataset, state, RoundInputs(values, rounds_keys), records, chunks,
                   hooks)
    except BaseException as stop:
        followers.ended(records, "interrupted" if isinstance(stop, KeyboardInterrupt)
                        else "error")
        raise
    followers.ended(records)
    return records[:len(chunk)]


def _spend_privacy(program: RoundProgram, members: Sequence[Member],
                   records: Sequence[MemberRecord]) -> None:
    """Each member's epsilons, from its own noise multiplier (once per noise: seeds and
    padding share it)."""
    privacy = program.run_plan.privacy
    if privacy is None:
        return
    spent: dict[Any, Any] = {}
    for member, record in zip(members, records):
        noise = member.config.dp_noise
        if noise not in spent:
            spent[noise] = privacy.epsilons(program.run_plan.rounds, noise)
        record.epsilons = spent[noise]


def _progress(record: MemberRecord) -> dict[str, Any]:
    """What a chunk's checkpoint keeps of a member's record."""
    return {"rows": record.rows, "round_seconds": record.round_seconds,
            "status": record.status, "comm_total": record.comm_total,
            "diverged_row": record.diverged_row}


def _restore(folder: Path, place: dict, state, rounds_keys, records: list[MemberRecord]
             ) -> Optional[tuple[Any, int]]:
    """The chunk's state and records from the checkpoint in `folder`, and its last round;
    None if the checkpoint is another chunk's."""
    meta = checkpoint.latest(folder).progress
    if {k: meta.get(k) for k in place} != place:
        return None
    saved = checkpoint.restore(folder, state, rounds_keys)
    for record, kept in zip(records, saved.progress["records"]):
        record.rows.extend(kept["rows"])
        record.round_seconds.extend(kept["round_seconds"])
        record.status, record.comm_total = kept["status"], kept["comm_total"]
        record.diverged_row = kept["diverged_row"]
    return saved.state, saved.round


def _dataset_for(plan: Plan, built: dict, given: Optional[FederatedDataset],
                 cache_dir) -> FederatedDataset:
    """A group's dataset (`plan`: its first member's): built once per data spec (its held-out
    clients, `--unseen-share`, once per share)."""
    spec = plan.data
    if given is not None:
        if given.num_clients != spec.clients:
            raise ConfigError(f"the dataset passed has {given.num_clients} clients but the "
                              f"sweep's config says clients={spec.clients}")
        return with_held_out(given, spec)
    key = dataclasses.replace(spec, unseen_share=None)
    if key not in built:
        built[key] = load_dataset(key, cache_dir)
    if spec not in built:
        built[spec] = with_held_out(built[key], spec)
    return built[spec]


def member_plans(members: Sequence[Member], model: Any, transform,
                 checkpoint_every: Optional[int]) -> dict[int, Plan]:
    """Every member's plan (`mcfl.runs.plan.resolve`), by its index: each member is checked as
    its own run would be, so that a grid may complete the base config (``--grid dp_noise=...``
    with ``--dp-clip``); a refusal names the sweep point."""
    plans = {}
    for member in members:
        try:
            plans[member.index] = resolve(member.config, model, transform, checkpoint_every)
        except ConfigError as e:
            where = ", ".join(f"{k}={v!r}" for k, v in member.point) or "the base config"
            raise ConfigError(f"sweep point {where}: {e}") from None
    return plans



def _group_settings(grp: Group) -> dict[str, Any]:
    """The settings every member of the group shares (those that differ: traced, seed)."""
    values = grp.base.to_dict()
    return {k: v for k, v in values.items() if k not in grp.traced and k != "seed"}


def _fill(result: SweepResult, members: list[Member], finished: dict[int, MemberRecord]
          ) -> None:
    """Rebuild the tables from the members finished so far (every member listed, in sweep
    order; those not finished "pending")."""
    result.members, result.rounds = sweep_folder.member_rows(members, finished)
    result.summary = tables.summary_rows(result.members, result.point_names)
