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

import contextlib
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
from mcfl.files.run_folder import RunTarget, check_target, recover_replacement
from mcfl.models.build import model_label
from mcfl.runs.execution import client_mesh, plan_run
from mcfl.runs.loop import LoopHooks, run_rounds
from mcfl.runs.plan import Plan, resolve
from mcfl.runs.program import RoundProgram, member_mesh, run_program
from mcfl.runs.records import MemberRecord
from mcfl.runs.resume import differences
from mcfl.runtime import distributed
from mcfl.sweeps import folder as sweep_folder
from mcfl.sweeps import tables
from mcfl.sweeps.members import default_width, fit, member_keys, memory_budget, padded
from mcfl.sweeps.observed import Followers, check_factories, later_columns
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


def sweep(
    config: Optional[RunConfig] = None,
    seeds: int | Sequence[int] | str = 1,
    grid: Optional[Mapping[str, Sequence[Any]]] = None,
    data_seeds: Optional[Sequence[int]] = None,
    out_dir: Optional[str | Path] = None,
    cache_dir: Optional[str | Path] = None,
    members_per_chunk: Optional[int] = None,
    member_width: Optional[int] | str = "auto",
    progress: Optional[Callable[[int, int], None]] = None,
    dataset: Optional[FederatedDataset] = None,
    overwrite: bool = False,
    model: Any = None,
    observers: Sequence[Any] = (),
    transform: Optional[Any] = None,
    resume: Optional[str | Path] = None,
    checkpoint_every: Optional[int] = None,
) -> SweepResult:
    """Run every combination of `grid` ({config key: [values]}, ``algorithm`` included) with
    every seed (a list, a count n for 0..n-1, or text like "0-7"). One dataset is shared (the
    config's data seed) unless `data_seeds` lists several, each its own group.

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
    if distributed.process_count() > 1:
        raise ConfigError("a sweep runs in one process (over all its devices); start it "
                          "without --coordinator")
    saved = None
    if resume is not None:
        resume = Path(resume)
        if out_dir is not None and Path(out_dir).resolve() != resume.resolve():
            raise ConfigError(f"a resumed sweep writes to its own folder {str(resume)!r}, not "
                              f"{str(out_dir)!r}")
        if overwrite:
            raise ConfigError("resume and overwrite contradict each other: pick one")
        recover_replacement(resume)  # (a replacement a kill cut short in its swap)
        saved = sweep_folder.read_spec(resume)
        config, seeds, grid, data_seeds, members_per_chunk, member_width, checkpoint_every = (
            _resumed_settings(saved, config, resume, checkpoint_every))
        out_dir = resume
    elif config is None:
        raise ConfigError("sweep() needs a config, or resume=FOLDER to finish a stopped sweep")
    if model is not None:
        config = config.replace(model=model_label(model))
    check_every(checkpoint_every)
    seeds = parse_seeds(seeds)
    grid = check_grid(grid)
    observers = check_factories(observers)
    if members_per_chunk is not None and (isinstance(members_per_chunk, bool) or not
                                          isinstance(members_per_chunk, int)
                                          or members_per_chunk < 1):
        raise ConfigError(f"members_per_chunk must be an integer >= 1, got "
                          f"{members_per_chunk!r}")
    if member_width == "auto":
        member_width = default_width()
    elif member_width is not None and (isinstance(member_width, bool) or not
                                       isinstance(member_width, int) or member_width < 1):
        raise ConfigError(f"member_width must be 'auto', None or an integer >= 1, got "
                          f"{member_width!r}")
    if data_seeds is not None:
        data_seeds = parse_seeds(data_seeds, what="data_seeds")  # (a count, a list or text)
    if config.clients is None:  # a natural dataset (leaf): all its users
        if dataset is not None:
            config = config.replace(clients=dataset.num_clients)
        else:
            users = load_dataset(resolve_data(config.data, config.seed), cache_dir)
            config = config.replace(clients=users.num_clients)
    members = expand(config, seeds, grid, data_seeds)
    check_settings_taken(config, (m.config.algorithm for m in members))
    plans = member_plans(members, model, transform, checkpoint_every)
    groups = group(members)
    transform_name = (transform or IDENTITY).name
    spec = {"config": config.to_dict(), "seeds": list(seeds), "grid":
            {k: list(v) for k, v in grid.items()},
            "data_seeds": None if data_seeds is None else list(data_seeds),
            "members": len(members), "groups": len(groups), "member_width": member_width,
            "members_per_chunk": members_per_chunk, "checkpoint_every": checkpoint_every,
            "transform": transform_name}
    out = Path(out_dir) if out_dir is not None else None
    finished: dict[int, MemberRecord] = {}
    if saved is not None:
        if saved.get("transform", IDENTITY.name) != transform_name:
            raise ConfigError(f"the sweep in {str(out)!r} ran with the message transform "
                              f"{saved.get('transform')!r}; resume it with the same one "
                              f"(given: {transform_name!r})")
        atomic.remove_temporaries(out)
        finished = sweep_folder.finished_records(out, members)
        if saved.get("status") == "completed" and len(finished) == len(members):
            return _read_back(spec, saved, members, finished)
    elif out is not None:
        check_target(out, overwrite, "sweep")
    # Bad data, or a model that fails on them, are refused before any file is made.
    datasets: dict[tuple, FederatedDataset] = {}
    run_plans = {g: plan_run(plans[grp.members[0].index],
                             _dataset_for(plans[grp.members[0].index], datasets, dataset,
                                          cache_dir))
                 for g, grp in enumerate(groups)
                 if not all(m.index in finished for m in grp.members)}
    target = RunTarget(out, "sweep") if out is not None and saved is None else None
    folder = target.folder if target is not None else out
    result = SweepResult(spec, [], [], [], [])
    client_mesh(config.devices)  # checks the device count
    devices = config.devices or len(jax.devices())
    mesh = member_mesh(devices)
    # Each group's record (its chunk size above all: a resumed sweep cuts the same chunks).
    group_runs = {g["group"]: g for g in (saved or {}).get("groups_run", [])}
    result.groups = [group_runs[g] for g in sorted(group_runs)]
    writer = _Writer(folder, result, members, finished)
    writer.write(final=False)  # sweep.json first: the folder says what it is from the start
    total = sum(m.config.rounds for m in members)  # member-rounds (rounds may be on the grid)
    counter = _Counter(progress, total,
                       sum(m.config.rounds for m in members if m.index in finished))
    status = "completed"
    programs: list[RoundProgram] = []
    stop_requests = StopRequests() if folder is not None else None
    output = _SweepOutput(folder, checkpoint_every, stop_requests, target, writer)
    try:
        with stop_requests or contextlib.nullcontext():
            for g, grp in enumerate(groups):
                if all(m.index in finished for m in grp.members):
                    continue
                base = plans[grp.members[0].index]
                data = _dataset_for(base, datasets, dataset, cache_dir)
                program, _ = run_program(base, run_plans[g], data.arrays, None,
                                         members=True, traced=grp.traced,
                                         member_count=len(grp.members), mesh=mesh,
                                         width=member_width)
                programs.append(program)
                compiled_before = program.compile_seconds  # (a kept program: compiled already)
                chunk_size = group_runs.get(g, {}).get("members_per_chunk", members_per_chunk)
                size = fit(program, grp.members, data.arrays, memory_budget(), devices,
                           chunk_size)
                info = {"group": g, "members": len(grp.members), "traced": list(grp.traced),
                        "members_per_chunk": size, "member_width": member_width,
                        "compile_seconds": program.compile_seconds - compiled_before,
                        "settings": _group_settings(grp), "init_seconds": 0.0}
                group_runs[g] = info
                result.groups = [group_runs[k] for k in sorted(group_runs)]
                writer.write(final=False)  # (the chunk size, for a resumed sweep's chunks)
                counter.tick(0)
                t0 = time.perf_counter()
                for start in range(0, len(grp.members), size):
                    chunk = list(grp.members[start:start + size])
                    if all(m.index in finished for m in chunk):
                        continue
                    records = _run_chunk(program, grp, g, start, chunk, size, data, info,
                                         observers, spec, counter, output)
                    for m, record in zip(chunk, records):
                        finished.setdefault(m.index, record)  # (one read back stays)
                    writer.write(final=False)
                    output.chunk_done()
                info["run_seconds"] = time.perf_counter() - t0
    except BaseException as stop:
        status = "interrupted" if isinstance(stop, KeyboardInterrupt) else "error"
        if target is not None and target.pending:  # a replacement stopped before its start
            target.abandon()
            writer.folder = None
        raise
    finally:
        for program in programs:  # a disk store's temporary folder goes
            program.close()
        output.close()
        spec.update(status=status, wall_seconds=counter.seconds(),
                    backend=jax.default_backend(), devices=len(jax.devices()),
                    jax_version=jax.__version__)
        writer.write(final=status == "completed")
    if target is not None:
        output.commit()  # (a sweep that finished before its first checkpoint)
    return result


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


class _SweepOutput:
    """Where a sweep's chunk checkpoints go, and for a sweep replacing another (--overwrite),
    the swap, done once the new sweep has its first checkpoint."""

    def __init__(self, folder: Optional[Path], every: Optional[int],
                 stop_requests: Optional[StopRequests], target: Optional[RunTarget],
                 writer: _Writer):
        self.folder, self.every, self.stop_requests = folder, every, stop_requests
        self.target, self.writer = target, writer
        self.checkpoints: Optional[Checkpoints] = None

    @property
    def replacing(self) -> bool:
        return self.target is not None and self.target.pending

    def chunk_started(self) -> Optional[Checkpoints]:
        if self.folder is None:
            return None
        self.checkpoints = Checkpoints(self.folder, self.every)
        return self.checkpoints

    def chunk_done(self) -> None:
        """The chunk's members are in the tables: its checkpoint is no longer needed."""
        self.close()
        if self.folder is not None:
            shutil.rmtree(self.folder / checkpoint.FOLDER, ignore_errors=True)

    def commit(self) -> None:
        if self.replacing:
            if self.checkpoints is not None:
                self.checkpoints.close()
            self.target.commit()
            self.folder = self.target.folder
            self.writer.moved(self.folder)
            if self.checkpoints is not None:
                self.checkpoints.move_to(self.folder)

    def close(self) -> None:
        if self.checkpoints is not None:
            self.checkpoints.close()
            self.checkpoints = None


class _ChunkHooks(LoopHooks):
    """A chunk's side of the round loop: member-rounds counted as the chunks of rounds
    finish; each member's rows to its observers (`followers`); a checkpoint when due (and
    after the first chunk of rounds of a replacing sweep, and when a signal asked to stop,
    which then stops the sweep)."""

    def __init__(self, chunks, members: int, counter: _Counter, followers: Followers,
                 output: _SweepOutput, save):
        self.chunks, self.members, self.counter = chunks, members, counter
        self.followers, self.output, self.save = followers, output, save

    def row(self, member: int, row: dict[str, Any]) -> None:
        self.followers.row(member, row)

    def chunk_finished(self, index: int, last_round: int, state) -> None:
        self.counter.tick(self.chunks[index][1] * self.members)  # members share the rounds
        output = self.output
        if output.checkpoints is None:
            return
        requested = output.stop_requests.requested
        if requested is not None or output.replacing or output.checkpoints.due(last_round):
            with output.stop_requests.deferred():
                self.save(last_round, state)
            output.commit()
        if requested is not None:
            raise KeyboardInterrupt(f"signal {requested}")


def _run_chunk(program: RoundProgram, grp: Group, g: int, start: int, chunk: list[Member],
               size: int, dataset: FederatedDataset, info: dict, observers, spec,
               counter: _Counter, output: _SweepOutput) -> list[MemberRecord]:
    """Train `chunk`'s members (padded to `size`) through every round, from the chunk's
    checkpoint if the folder holds one: their records (and their observers told of their start
    and end)."""
    members = padded(chunk, size)
    values = program.values([m.config for m in members])
    init_keys, rounds_keys = member_keys(members)
    t0 = time.perf_counter()
    state = program.init(values, init_keys, dataset.arrays)
    info["init_seconds"] += time.perf_counter() - t0
    records = [MemberRecord() for _ in members]
    privacy = program.run_plan.privacy
    if privacy is not None:  # each member's epsilon, from its own noise multiplier
        spent: dict[Any, Any] = {}  # epsilons by noise (once each: seeds and padding share it)
        for member, record in zip(members, records):
            noise = member.config.dp_noise
            if noise not in spent:
                spent[noise] = privacy.epsilons(program.run_plan.rounds, noise)
            record.epsilons = spent[noise]
    place = {"group": g, "first": start, "members": [m.index for m in members]}
    chunks = program.chunks
    checkpoints = output.chunk_started()
    if checkpoints is not None and checkpoint.exists(output.folder):
        resumed = _restore(output.folder, place, state, rounds_keys, records)
        if resumed is not None:
            state, done = resumed
            checkpoints.resumed_at(done)
            chunks = chunks.after(done)
            counter.tick(done * len(chunk))
        else:  # another chunk's (finished, or from a sweep since changed): not this one's
            shutil.rmtree(output.folder / checkpoint.FOLDER, ignore_errors=True)

    def save(last_round: int, state) -> None:
        checkpoints.save(last_round, state, rounds_keys, grp.base.to_dict(),
                         {**place, "records": [_progress(r) for r in records]}, [])

    followers = Followers(observers, chunk, spec)
    hooks = _ChunkHooks(chunks, len(chunk), counter, followers, output, save)
    followers.started(later_columns(program, dataset))
    for m, record in enumerate(records):  # a resumed chunk's rows so far
        for row in record.rows:
            followers.row(m, row)
    try:
        run_rounds(program, dataset, state, values, rounds_keys, records, chunks, hooks)
    except BaseException as stop:
        followers.ended(records, "interrupted" if isinstance(stop, KeyboardInterrupt)
                        else "error")
        raise
    followers.ended(records)
    return records[:len(chunk)]


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
