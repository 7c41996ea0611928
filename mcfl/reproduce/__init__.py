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
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from mcfl.config import RunConfig, from_dict
from mcfl.data import DATA_FIELDS, load_dataset
from mcfl.errors import ConfigError, DataError, choice_error
from mcfl.files.run_folder import prepare_folder
from mcfl.reproduce.report import REPORT_FILES, ordering_line, table_row, write_report
from mcfl.reproduce.tables import TABLES, Cell, Table, experiment, get, names
from mcfl.sweeps import sweep

__all__ = ["TABLES", "Table", "base_config", "cell_configs", "get", "names", "ordering_line",
           "run_table"]


def base_config(table: Table, quick: bool, overrides: Optional[dict] = None) -> RunConfig:
    """The config a form of `table` starts from: its experiments/ file, the form's changes,
    then `overrides`."""
    return from_dict({**table.base(quick), **(overrides or {})})


def cell_configs(table: Table, base: RunConfig, quick: bool = False,
                 data_dir: Optional[str] = None,
                 overrides: Optional[dict] = None) -> list[tuple[Cell, RunConfig]]:
    """Every cell's config (validated before anything runs): `base` with the cell's changes,
    or for a cell on a part of its own, the part's experiments/ file with the form's changes,
    `overrides` and the cell's. A cell's relative data_dir is a folder inside `data_dir`
    (the user's --data-dir)."""
    out = []
    for cell in table.cells_of(quick):
        changes = dict(cell.changes)
        if "data_dir" in changes and data_dir is not None:
            changes["data_dir"] = str(Path(data_dir).expanduser() / changes["data_dir"])
        try:
            if cell.setting in (None, table.setting_of(quick)):
                out.append((cell, base.replace(**changes)))
            else:
                out.append((cell, from_dict({**experiment(cell.setting),
                                             **table.form(quick).changes, **(overrides or {}),
                                             **changes})))
        except ConfigError as e:
            raise ConfigError(f"cell {cell.label!r}: {e}") from None
    return out


def select_cells(chosen: list[tuple[Cell, RunConfig]], patterns: list[str]
                 ) -> list[tuple[Cell, RunConfig]]:
    """The cells whose label matches one of `patterns` (a label, or a shell pattern such as
    'FEMNIST *'); a pattern matching none is an error naming the labels."""
    labels = [c.label for c, _ in chosen]
    for pattern in patterns:
        if not fnmatch.filter(labels, pattern):
            raise choice_error("cell", pattern, labels)
    return [(c, config) for c, config in chosen
            if any(fnmatch.fnmatchcase(c.label, p) for p in patterns)]


def check_data_dirs(table: Table, quick: bool, data_dir: Optional[str],
                     cells: list[tuple[Cell, RunConfig]]) -> None:
    """A table reading the user's data (its full form) needs --data-dir, and each chosen
    cell's folder there; both are checked before anything runs."""
    if quick or not table.data_layout:
        return
    if data_dir is None:
        raise ConfigError(f"{table.name} reads {table.data_layout}: pass --data-dir DIR "
                          f"(its --quick form runs offline)")
    for cell, config in cells:
        if not (Path(config.data_dir) / "train").is_dir():
            raise DataError(f"cell {cell.label!r} reads {config.data_dir}/train, which does not "
                            f"exist; --data-dir must be {table.data_layout} (or choose other "
                            "cells with --cells)")


def run_table(name: str, out_dir: Path, quick: bool = False, seeds: Optional[int] = None,
              overrides: Optional[dict] = None, cache_dir=None,
              progress: Optional[Callable[[str, int, int], None]] = None,
              overwrite: bool = False, cells: Optional[list[str]] = None,
              data_dir: Optional[str] = None) -> dict[str, Any]:
    """Run every cell of table `name` (or those matching `cells`: labels or shell patterns)
    over `seeds` seeds (the form's default) and write the table; returns its rows and spec.
    `data_dir` is the table's data: for a table with a `data_layout` (fesem-table1, full form)
    the folder holding its cells' folders, for the others the base's data_dir (e.g. a folder
    with the Fashion-MNIST files). A folder already holding a table is refused unless
    `overwrite`."""
    table = get(name)
    form = table.form(quick)
    count = seeds if seeds is not None else form.seeds
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"seeds must be an integer >= 1, got {count!r}")
    overrides = dict(overrides or {})
    if data_dir is not None and not (table.data_layout and not quick):
        overrides["data_dir"] = data_dir
    base = base_config(table, quick, overrides)
    chosen = cell_configs(table, base, quick, data_dir, overrides)
    if cells is not None:
        chosen = select_cells(chosen, cells)
    check_data_dirs(table, quick, data_dir, chosen)
    seed_list = [base.seed + i for i in range(count)]
    prepare_folder(out_dir, overwrite, REPORT_FILES)
    started = time.perf_counter()
    rows: list[dict] = []
    dataset, data_key = None, None  # one dataset held at a time: cells of one part share it
    for i, (cell, config) in enumerate(chosen):
        if progress is not None:
            progress(cell.label, i, len(chosen))
        config = config.replace(data_seed=base.seed)  # every seed trains on one data draw
        key = tuple(str(getattr(config, k)) for k in DATA_FIELDS + ("data_seed",))
        if key != data_key:
            dataset = None  # let the previous one go before loading the next
            dataset, data_key = load_dataset(config, cache_dir), key
        if config.clients is None:  # a natural dataset (leaf): all its users
            config = config.replace(clients=dataset.num_clients)
        t0 = time.perf_counter()
        result = sweep(config, seeds=seed_list, dataset=dataset,
                       out_dir=out_dir / "cells" / slug(cell.label), overwrite=overwrite)
        rows.append(table_row(table, cell, result, time.perf_counter() - t0))
        write_report(out_dir, table, quick, base, seed_list, rows,
                     time.perf_counter() - started, final=False)
    spec = write_report(out_dir, table, quick, base, seed_list, rows,
                        time.perf_counter() - started, final=True)
    return {"rows": rows, "spec": spec}


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


