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
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import jax

from mcfl.config import RunConfig
from mcfl.data import DATA_FIELDS, FederatedDataset, load_dataset, with_all_users
from mcfl.errors import ConfigError
from mcfl.files import atomic
from mcfl.files.run_folder import check_target, prepare_folder
from mcfl.models.build import model_label
from mcfl.runs.execution import client_mesh, plan_run
from mcfl.runs.loop import LoopHooks, run_rounds
from mcfl.runs.program import RoundProgram, member_mesh
from mcfl.runs.records import MemberRecord
from mcfl.runs.stored_program import run_program
from mcfl.runtime import distributed
from mcfl.sweeps import tables
from mcfl.sweeps.members import default_width, fit, member_keys, memory_budget, padded
from mcfl.sweeps.observed import Followers, check_factories, later_columns
from mcfl.sweeps.spec import Group, Member, check_grid, expand, group, parse_seeds

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
        return _write(Path(out_dir), self, final=True)


def sweep(
    config: RunConfig,
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
) -> SweepResult:
    """Run every combination of `grid` ({config key: [values]}, ``algorithm`` included) with
    every seed (a list, a count n for 0..n-1, or text like "0-7"). One dataset is shared (the
    config's data seed) unless `data_seeds` lists several, each its own group.

    Members of a group run as one compiled program, in chunks of at most `members_per_chunk`
    (default: as many as fit in memory); `member_width` of them side by side (vmapped), the
    rest one after another inside the same program ("auto": 1 on CPU, all on GPU / TPU, see
    `mcfl.sweeps.members.default_width`; None: all). `progress(done, total)` counts
    member-rounds. With `out_dir`, the tables are rewritten there after every chunk, so a
    sweep that stops keeps the members it finished; a folder already holding a sweep is
    refused unless `overwrite` (which deletes its files first). Every member's rows equal
    ``mcfl.run`` of its config (the member table's seed, data seed and grid values on
    `config`) to float rounding. `model` trains a user's flax module (or factory, or
    `mcfl.models.ModelSpec`) in every member, as in `mcfl.run`; so does `transform`, what
    every client message goes through (`mcfl.transforms`).

    `observers` follow each member as a run of its own: each makes the member's
    `mcfl.RunObserver` (``observer.member(member, spec)``, `mcfl.sweeps.observed`), as the
    trackers of `mcfl.tracking` do (one tracking run per member, grouped by grid point).
    """
    if distributed.process_count() > 1:
        raise ConfigError("a sweep runs in one process (over all its devices); start it "
                          "without --coordinator")
    if model is not None:
        config = config.replace(model=model_label(model))
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
            config, _ = with_all_users(config, cache_dir)
    members = expand(config, seeds, grid, data_seeds)
    groups = group(members)
    spec = {"config": config.to_dict(), "seeds": list(seeds), "grid":
            {k: list(v) for k, v in grid.items()},
            "data_seeds": None if data_seeds is None else list(data_seeds),
            "members": len(members), "groups": len(groups)}
    started = time.perf_counter()
    total = sum(m.config.rounds for m in members)  # member-rounds (rounds may be on the grid)
    done = 0
    runs: list[tuple[Member, MemberRecord]] = []
    group_info: list[dict[str, Any]] = []
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        check_target(out, overwrite, SWEEP_FILES)
    datasets: dict[tuple, FederatedDataset] = {}
    _dataset_for(groups[0], datasets, dataset, cache_dir)  # bad data: refused before any file
    if out is not None:
        prepare_folder(out, overwrite, SWEEP_FILES)
    result = SweepResult(spec, [], [], [], group_info)
    client_mesh(config.devices)  # checks the device count
    devices = config.devices or len(jax.devices())
    mesh = member_mesh(devices)
    status = "completed"
    programs: list[RoundProgram] = []

    def tick(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, total)

    try:
        for g, grp in enumerate(groups):
            data = _dataset_for(grp, datasets, dataset, cache_dir)
            program, _ = run_program(grp.base, plan_run(grp.base, data, model), data.arrays,
                                     None, members=True, traced=grp.traced,
                                     member_count=len(grp.members), mesh=mesh,
                                     width=member_width, transform=transform)
            programs.append(program)
            compiled_before = program.compile_seconds  # (a kept program has compiled already)
            size = fit(program, grp.members, data.arrays, memory_budget(), devices,
                       members_per_chunk)
            info = {"group": g, "members": len(grp.members), "traced": list(grp.traced),
                    "members_per_chunk": size, "member_width": member_width,
                    "compile_seconds": program.compile_seconds - compiled_before,
                    "settings": _group_settings(grp)}
            group_info.append(info)
            tick(0)
            t0 = time.perf_counter()
            info["init_seconds"] = 0.0  # the members' initialisations (FeSEM's k-means, ...)
            for start in range(0, len(grp.members), size):
                chunk = list(grp.members[start:start + size])
                followers = Followers(observers, chunk, spec)
                hooks = _Progress(program.chunks, len(chunk), tick, followers)
                runs.extend(zip(chunk, _run_chunk(program, grp, chunk, size, data, info,
                                                  hooks, followers)))
                _fill(result, runs)
                if out is not None:
                    _write(out, result, final=False)
            info["run_seconds"] = time.perf_counter() - t0
    except BaseException as stop:
        status = "interrupted" if isinstance(stop, KeyboardInterrupt) else "error"
        raise
    finally:
        for program in programs:  # a disk store's temporary folder goes
            program.close()
        result.spec.update(status=status, wall_seconds=time.perf_counter() - started,
                           backend=jax.default_backend(), devices=len(jax.devices()),
                           jax_version=jax.__version__)
        _fill(result, runs)
        if out is not None:
            _write(out, result, final=status == "completed")
    return result


class _Progress(LoopHooks):
    """Counts member-rounds as the chunks of rounds finish; hands each member's rows to its
    observers (`followers`)."""

    def __init__(self, chunks, members: int, tick, followers: Followers):
        self.chunks, self.members, self.tick = chunks, members, tick
        self.followers = followers

    def row(self, member: int, row: dict[str, Any]) -> None:
        self.followers.row(member, row)

    def chunk_finished(self, index: int, last_round: int, state) -> None:
        self.tick(self.chunks[index][1] * self.members)  # a chunk's members share its rounds


def _run_chunk(program: RoundProgram, grp: Group, chunk: list[Member], size: int,
               dataset: FederatedDataset, info: dict, hooks: LoopHooks,
               followers: Followers) -> list[MemberRecord]:
    """Train `chunk`'s members (padded to `size`) through every round: their records (and
    their observers told of their start and end)."""
    members = padded(chunk, size)
    values = program.values([m.config for m in members])
    init_keys, rounds_keys = member_keys(members)
    t0 = time.perf_counter()
    state = program.init(values, init_keys, dataset.arrays)
    info["init_seconds"] += time.perf_counter() - t0
    records = [MemberRecord() for _ in members]
    followers.started(later_columns(program, dataset))
    try:
        run_rounds(program, grp.base, dataset, state, values, rounds_keys, records,
                   program.chunks, hooks)
    except BaseException as stop:
        followers.ended(records, "interrupted" if isinstance(stop, KeyboardInterrupt)
                        else "error")
        raise
    followers.ended(records)
    return records[:len(chunk)]


def _dataset_for(grp: Group, built: dict, given: Optional[FederatedDataset],
                 cache_dir) -> FederatedDataset:
    """The group's dataset: built once per data config and data seed."""
    config = grp.base
    if given is not None:
        if given.num_clients != config.clients:
            raise ConfigError(f"the dataset passed has {given.num_clients} clients but the "
                              f"sweep's config says clients={config.clients}")
        return given
    key = tuple((name, repr(getattr(config, name))) for name in DATA_FIELDS) + (
        ("data_seed", config.data_seed),)
    if key not in built:
        built[key] = load_dataset(config, cache_dir)
    return built[key]


def _group_settings(grp: Group) -> dict[str, Any]:
    """The settings every member of the group shares (those that differ: traced, seed)."""
    values = grp.base.to_dict()
    return {k: v for k, v in values.items() if k not in grp.traced and k != "seed"}


def _fill(result: SweepResult, runs: list[tuple[Member, MemberRecord]]) -> None:
    """Rebuild the tables from the members finished so far (in sweep order)."""
    ordered = sorted(runs, key=lambda run: run[0].index)
    result.members = [tables.member_row(m.index, m.point, m.seed, m.data_seed, r.status, r.rows)
                      for m, r in ordered]
    result.rounds = [{"member": m.index, **dict(m.point), "seed": m.seed,
                      "data_seed": m.data_seed, **row}
                     for m, r in ordered for row in r.rows]
    result.summary = tables.summary_rows(result.members, result.point_names)


SWEEP_FILES = ("sweep.json", "members.csv", "rounds.csv", "summary.csv", "curves.png")


def _write(out: Path, result: SweepResult, final: bool) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_csv(out / "members.csv", result.members)
    atomic.write_csv(out / "rounds.csv", result.rounds)
    atomic.write_csv(out / "summary.csv", result.summary)
    spec = {**result.spec, "groups_run": result.groups}
    atomic.write_json(out / "sweep.json", spec, default=_json_default)
    if final:
        completed = {m["member"] for m in result.members if m["status"] == "completed"}
        tables.plot_bands([r for r in result.rounds if r["member"] in completed],
                          result.point_names, out / "curves.png")
    return out


def _json_default(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)
