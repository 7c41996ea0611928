"""`mcfl reproduce NAME`: a paper's table, every cell a sweep over seeds, beside the paper's values.

A table (`mcfl.reproduce.tables`, read from experiments/tables/NAME.toml) is the paper's
setting, read from its experiments/ file, its cells, each a change of that setting, with the
paper's values of the table's metrics, and two forms: the full protocol and a quick form (fewer
rounds, seeds or clients, or offline data, said in its note) that runs in minutes on a 2-core
CPU. Cells run one after another as `mcfl.sweep`s over the seeds; cells on the same data share
one loaded dataset. The FlexCFL tables score by the paper's rule (`paper_best_accuracy_micro`:
FlexCFL Sec. 5.1, the best micro accuracy over the evaluated rounds once every client is in a
group); the FeSEM table reports the last round's micro / macro accuracy and F1. `run_table`
writes table.md (paper, mcfl mean +/- std over seeds, difference, settings), table.csv, a bar
plot (`mcfl.reproduce.report`) and each cell's sweep folder.
"""

from __future__ import annotations

import fnmatch
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from mcfl.config import CLUSTERED_ONLY, KEPT_STATE_ONLY, RunConfig, from_dict
from mcfl.data import DATA_FIELDS, cifar
from mcfl.errors import ConfigError, DataError, McflError, choice_error
from mcfl.files import faults, kinds
from mcfl.files.run_folder import recover_replacement
from mcfl.reproduce.report import Report, ordering_line, table_row
from mcfl.reproduce.tables import TABLES, Cell, Table, experiment, get, names
from mcfl.runs.lifecycle import Destination
from mcfl.runs.runner import load_dataset
from mcfl.sweeps import sweep
from mcfl.sweeps.spec import check_settings_taken, settings_not_taken

__all__ = ["TABLES", "Table", "base_config", "cell_configs", "get", "names", "ordering_line",
           "run_table"]


def base_config(table: Table, quick: bool, overrides: Optional[dict] = None) -> RunConfig:
    """The config a form of `table` starts from: its experiments/ file, the form's changes,
    then `overrides`."""
    return from_dict({**table.base(quick), **(overrides or {})})


def cell_configs(table: Table, base: RunConfig, quick: bool = False,
                 data_dir: Optional[str] = None, overrides: Optional[dict] = None,
                 patterns: Optional[list[str]] = None) -> list[tuple[Cell, RunConfig]]:
    """Every cell's config, or those of the cells `patterns` choose (`select_cells`),
    validated before anything runs: `base` with the cell's changes, or for a cell on a part of
    its own, the part's experiments/ file with the form's changes, `overrides` and the cell's.
    A cell's relative data_dir is a folder inside `data_dir` (the user's --data-dir)."""
    out = []
    cells = table.cells_of(quick)
    for cell in cells if patterns is None else select_cells(cells, patterns):
        changes = dict(cell.changes)
        if "data_dir" in changes and data_dir is not None:
            changes["data_dir"] = str(Path(data_dir).expanduser() / changes["data_dir"])
        try:
            if cell.setting in (None, table.setting_of(quick)):
                config = base.replace(**changes)
            else:
                config = from_dict({**experiment(cell.setting), **table.form(quick).changes,
                                    **(overrides or {}), **changes})
            # the base's K and the like go to the cells that take them, as a sweep's grid
            # gives them; a cell's own changes are its own (and refused if not taken)
            dropped = {key: default for key, default in
                       settings_not_taken(config, config.algorithm).items() if key not in changes}
            out.append((cell, config.replace(**dropped)))
        except ConfigError as e:
            raise ConfigError(f"cell {cell.label!r}: {e}") from None
    given = [key for key in CLUSTERED_ONLY + KEPT_STATE_ONLY if key in (overrides or {})]
    check_settings_taken(base, (config.algorithm for _, config in out), "the table's cells", given)
    return out


def select_cells(cells: list[Cell], patterns: list[str]) -> list[Cell]:
    """The cells whose label matches one of `patterns` (a label, or a shell pattern such as
    'FEMNIST *'); a pattern matching none is an error naming the labels."""
    labels = [c.label for c in cells]
    for pattern in patterns:
        if not fnmatch.filter(labels, pattern):
            raise choice_error("cell", pattern, labels)
    return [c for c in cells if any(fnmatch.fnmatchcase(c.label, p) for p in patterns)]


def check_data_dirs(table: Table, quick: bool, data_dir: Optional[str],
                    cells: list[tuple[Cell, RunConfig]]) -> None:
    """The chosen cells that read the user's data (those naming a folder inside --data-dir, in
    the full form) need --data-dir, and their folder there in their dataset's layout; both
    are checked before anything runs. Cells on bundled data need nothing."""
    reading = [(cell, config) for cell, config in cells if "data_dir" in cell.changes]
    if quick or not table.data_layout or not reading:
        return
    if data_dir is None:
        raise ConfigError(f"{table.name} reads {table.data_layout}: pass --data-dir DIR "
                          f"(its --quick form runs offline)")
    for cell, config in reading:
        try:
            if config.dataset in cifar.LAYOUTS:
                cifar.find_folder(cifar.LAYOUTS[config.dataset], config.data_dir)
            elif not (Path(config.data_dir) / "train").is_dir():  # LEAF's train/ and test/
                raise DataError(f"it reads {config.data_dir}/train, which does not exist; "
                                f"--data-dir must be {table.data_layout} (or choose other "
                                "cells with --cells)")
        except DataError as e:
            raise DataError(f"cell {cell.label!r}: {e}") from None


def run_table(name: Optional[str] = None, out_dir: Optional[Path] = None, quick: bool = False,
              seeds: Optional[int] = None, overrides: Optional[dict] = None, cache_dir=None,
              progress: Optional[Callable[[str, int, int], None]] = None,
              overwrite: bool = False, cells: Optional[list[str]] = None,
              data_dir: Optional[str] = None, resume: Optional[Path] = None) -> dict[str, Any]:
    """Run every cell of table `name` (or those matching `cells`: labels or shell patterns)
    over `seeds` seeds (the form's default) and write the table; returns its rows and spec.
    `data_dir` is the table's data: for a table with a `data_layout` (fesem-table1, full form)
    the folder holding its cells' folders, for the others the base's data_dir (e.g. a folder
    with the Fashion-MNIST files).

    reproduce.json is written at the start (status "running") and table.md / table.csv after
    every cell, each saying which cells are still missing until the table completes. A folder
    already holding a table is refused unless `overwrite` (the new table replaces it once its
    first cell is done); a folder holding anything else is refused. ``resume=FOLDER`` finishes
    the table stopped there, with its own settings: finished cells are read back from their
    sweep folders, a cell stopped midway continues from its checkpoint (`mcfl.sweep`'s
    resume), and the rest run; the table equals the uninterrupted one apart from timings."""
    if resume is not None:
        resume = Path(resume)
        given = {"name": name, "seeds": seeds, "overrides": overrides, "cells": cells,
                 "data_dir": data_dir}
        extra = [k for k, v in given.items() if v] + (["quick"] if quick else []) + (
            ["overwrite"] if overwrite else [])
        if extra:
            raise ConfigError("a resumed table runs with its own settings (reproduce.json); "
                              "drop " + ", ".join(extra))
        if out_dir is not None and Path(out_dir).resolve() != resume.resolve():
            raise ConfigError(f"a resumed table writes to its own folder {str(resume)!r}; "
                              "drop --out")
        saved = read_spec(resume)
        name, quick, seeds, overrides = (saved["table"], saved["quick"], len(saved["seeds"]),
                                         saved.get("overrides"))
        cells, data_dir, out_dir = saved.get("chosen_cells"), saved.get("data_dir"), resume
    if name is None or out_dir is None:
        raise ConfigError("run_table() needs a table name and out_dir, or resume=FOLDER")
    out_dir = Path(out_dir)
    table = get(name)
    form = table.form(quick)
    count = seeds if seeds is not None else form.seeds
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"seeds must be an integer >= 1, got {count!r}")
    given_overrides = dict(overrides or {})
    overrides = dict(given_overrides)
    if data_dir is not None and not (table.data_layout and not quick):
        overrides["data_dir"] = data_dir
    base = base_config(table, quick, overrides)
    chosen = cell_configs(table, base, quick, data_dir, overrides, cells)
    check_data_dirs(table, quick, data_dir, chosen)
    seed_list = [base.seed + i for i in range(count)]
    destination = Destination(out_dir, "table", overwrite, resuming=resume is not None)
    folder = destination.open()
    settings = {"overrides": given_overrides, "data_dir": data_dir,
                "chosen_cells": None if cells is None else [c.label for c, _ in chosen]}
    report = Report(folder, table, quick, base, seed_list, [c.label for c, _ in chosen],
                    settings)
    destination.on_move(lambda moved: setattr(report, "folder", moved))
    report.write(final=False)  # reproduce.json first: the folder says what it is at once
    rows: dict[str, dict] = {}
    dataset, data_key = None, None  # one dataset held at a time: cells of one part share it
    try:
        for i, (cell, config) in enumerate(chosen):
            if progress is not None:
                progress(cell.label, i, len(chosen))
            cell_folder = destination.folder / "cells" / slug(cell.label)
            t0 = time.perf_counter()
            held = kinds.status(cell_folder, "sweep")
            if held == "completed":  # finished before a stop: read back, not recomputed
                result = sweep(resume=cell_folder)
            else:
                config = config.replace(data_seed=base.seed)  # every seed: one data draw
                key = tuple(str(getattr(config, k)) for k in DATA_FIELDS + ("data_seed",))
                if key != data_key:
                    dataset = None  # let the previous one go before loading the next
                    dataset, data_key = load_dataset(config, cache_dir), key
                if config.clients is None:  # a natural dataset (leaf): all its users
                    config = config.replace(clients=dataset.num_clients)
                result = sweep(config, seeds=seed_list, dataset=dataset, out_dir=cell_folder,
                               resume=cell_folder if held is not None else None)
            rows[cell.label] = table_row(table, cell, result, time.perf_counter() - t0, quick)
            report.rows = [rows[c.label] for c, _ in chosen if c.label in rows]
            report.write(final=False)
            faults.point("cell")
            destination.commit()  # (a replacement's first cell is done: it is swapped in)
    except BaseException as stop:
        if destination.replacing:  # the old table stands
            destination.abandon(stop)
        else:
            report.write(final=False, status="interrupted" if isinstance(
                stop, KeyboardInterrupt) else "error")
        raise
    spec = report.write(final=True)
    return {"rows": report.rows, "spec": spec}


def read_spec(folder: Path) -> dict[str, Any]:
    """reproduce.json of the table stopped in `folder`; one line if there is none to finish."""
    if not folder.is_dir():
        raise McflError(f"--resume {str(folder)!r}: no such folder (it takes a reproduced "
                        "table's folder)")
    recover_replacement(folder)
    kinds.check_kind(folder, "table", resuming=True)
    path = folder / "reproduce.json"
    try:
        spec = json.loads(path.read_text())
        if not isinstance(spec.get("table"), str) or not isinstance(spec.get("seeds"), list):
            raise ValueError("no table or seeds")
    except FileNotFoundError:
        raise McflError(f"{str(folder)!r} holds no reproduced table to resume "
                        "(reproduce.json is missing)") from None
    except (ValueError, AttributeError, UnicodeDecodeError) as e:
        raise McflError(f"{str(path)!r} is not a reproduced table's record: {e}") from None
    if spec.get("status") == "completed":
        raise McflError(f"the table in {str(folder)!r} is complete; there is nothing to resume")
    return spec


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


