"""The papers' tables `mcfl reproduce` knows, one file each: experiments/tables/NAME.toml
(installed with mcfl as `mcfl.experiments`, beside the settings files). A table names its
setting's file in experiments/ (the single source of its settings, also a config file for
`mcfl run --config`), its cells (a change of that setting: the algorithm and its
hyperparameters, a shift, or another part of a table over several datasets) with the paper's
values, and two forms: the full protocol and a quick form that runs in minutes on a 2-core CPU.
This module holds the tables' shape (the dataclasses) and reads the files into `TABLES`.

A table file's keys are the fields of the dataclass of the same part:

- `Table`: title, source, setting (an experiments/ file's name, without .toml) and position
  (where the table comes in `mcfl reproduce --list`, 1 first); optionally data_layout and
  metrics (an array of {key, header, and optionally scale: 100, percent, by default; 1 for a
  value shown as it is, an epsilon}; the paper's rule when left out);
- [full] and [quick], the two `Form`s: changes, seeds and cost; optionally note, setting,
  claim, orderings (arrays of cell labels, best first) and cells of their own
  ([[quick.cells]]);
- [[cells]], one `Cell` each: label, changes and paper; optionally setting.

A paper value is a number, or an array with one per metric of the table; TOML has no null, so
the string "none" stands where the paper reports no value. An optional key left out takes the
dataclass's default. An unknown key, a missing required one or a value of the wrong type is a
`ConfigError` naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, Union

from mcfl.config import load_file
from mcfl.errors import ConfigError, choice_error
from mcfl.runs.records import PAPER_SCORE as SCORE

PaperValue = Union[None, float, tuple[Optional[float], ...]]
NO_VALUE = "none"  # a paper value the paper does not report, in a table file


@dataclasses.dataclass(frozen=True)
class Metric:
    key: str  # the sweep summary's metric (`mcfl.sweeps.tables.SUMMARY_METRICS`)
    header: str  # its column in table.md
    scale: float = 100.0  # shown times this: 100 for shares in percent, 1 for an epsilon


PAPER_RULE = Metric(SCORE, "accuracy (paper's rule)")


@dataclasses.dataclass(frozen=True)
class Cell:
    label: str  # the paper's column (and row, for tables with several)
    changes: dict[str, Any]  # config changes from the table's setting
    # The paper's values in percent, one per metric of the table (a float for one metric);
    # None where it reports none.
    paper: PaperValue
    # The experiments/ file of this cell's part of a table over several datasets (None: the
    # table's own)
    setting: Optional[str] = None

    def paper_values(self, count: int) -> tuple[Optional[float], ...]:
        if isinstance(self.paper, tuple):
            return self.paper
        return (self.paper,) + (None,) * (count - 1)


@dataclasses.dataclass(frozen=True)
class Form:
    """One way to run a table: its full protocol or its quick form."""

    changes: dict[str, Any]  # config changes from the table's setting
    seeds: int
    cost: str  # measured or estimated (say which)
    note: str = "full protocol"  # what the form changes
    cells: Optional[tuple[Cell, ...]] = None  # None: the table's cells
    # Chains of cell labels the paper ranks best first (checked against mcfl's means in
    # table.md), and the paper's claim in words where it reports no value for this setting.
    orderings: tuple[tuple[str, ...], ...] = ()
    claim: str = ""
    setting: Optional[str] = None  # its own experiments/ file (None: the table's)


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    title: str
    source: str  # paper and table
    setting: str  # experiments/SETTING.toml: the paper's setting as config keys
    cells: tuple[Cell, ...]
    full: Form
    quick: Form
    metrics: tuple[Metric, ...] = (PAPER_RULE,)
    # The full form reads data from the user's --data-dir with this layout; cells name their
    # folder inside it as a relative data_dir. "": no --data-dir needed.
    data_layout: str = ""

    def form(self, quick: bool) -> Form:
        return self.quick if quick else self.full

    def cells_of(self, quick: bool) -> tuple[Cell, ...]:
        return self.form(quick).cells or self.cells

    def setting_of(self, quick: bool) -> str:
        """The experiments/ file a form starts from."""
        return self.form(quick).setting or self.setting

    def base(self, quick: bool = False) -> dict[str, Any]:
        """The setting a form runs: its file's settings and the form's changes (flat keys)."""
        return {**experiment(self.setting_of(quick)), **self.form(quick).changes}

    def files(self) -> tuple[str, ...]:
        """Every experiments/ file the table reads."""
        names = [self.setting, self.full.setting, self.quick.setting,
                 *(c.setting for c in self.cells + (self.quick.cells or ()))]
        return tuple(dict.fromkeys(n for n in names if n is not None))


def _experiments() -> Path:
    """experiments/: installed with mcfl as `mcfl.experiments`, or in the source checkout mcfl
    is imported from (``PYTHONPATH=.`` on a machine where it is not installed)."""
    try:
        return Path(str(importlib.resources.files("mcfl.experiments")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "experiments"


def experiment(name: str) -> dict[str, Any]:
    """The settings in experiments/NAME.toml (installed with mcfl as `mcfl.experiments`)."""
    return load_file(_experiments() / f"{name}.toml")


class _Invalid(Exception):
    """A key of a table file holding what it may not (the loader adds the file)."""


_Reader = Callable[[Any, str], Any]  # (a TOML value, its key) -> the field's value


def _text(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"{key} must be a string, got {value!r}")
    return value


def _positive(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _Invalid(f"{key} must be an integer >= 1, got {value!r}")
    return value


def _changes(value: Any, key: str) -> dict[str, Any]:
    # their values are checked as a config when the table's cells are built
    if not isinstance(value, dict):
        raise _Invalid(f"{key} must be a table of config changes, got {value!r}")
    return value


def _paper(value: Any, key: str) -> PaperValue:
    def one(v: Any) -> Optional[float]:
        if v == NO_VALUE:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _Invalid(f'{key} must be a number, "{NO_VALUE}" or an array of them, '
                           f"got {value!r}")
        return float(v)

    return tuple(one(v) for v in value) if isinstance(value, list) else one(value)


def _chains(value: Any, key: str) -> tuple[tuple[str, ...], ...]:
    if not (isinstance(value, list) and all(
            isinstance(chain, list) and chain and all(isinstance(c, str) for c in chain)
            for chain in value)):
        raise _Invalid(f"{key} must be an array of arrays of cell labels, got {value!r}")
    return tuple(tuple(chain) for chain in value)


def _each(read: _Reader) -> _Reader:
    """A reader of a non-empty array of tables, each read by `read` as KEY[INDEX]."""
    def each(value: Any, key: str) -> tuple:
        if not (isinstance(value, list) and value and all(isinstance(v, dict) for v in value)):
            raise _Invalid(f"{key} must be a non-empty array of tables, got {value!r}")
        return tuple(read(v, f"{key}[{i}]") for i, v in enumerate(value))
    return each


def _fields(values: Any, key: str, schema: dict[str, tuple[_Reader, bool]]) -> dict[str, Any]:
    """The TOML table `values` at `key` read by `schema`: each key's reader and whether it is
    required."""
    if not isinstance(values, dict):
        raise _Invalid(f"{key} must be a table, got {values!r}")
    where = f"{key}." if key else ""
    for name in values:
        if name not in schema:
            raise _Invalid(f"unknown key {where}{name}; allowed: {', '.join(schema)}")
    for name, (_, required) in schema.items():
        if required and name not in values:
            raise _Invalid(f"missing key {where}{name}")
    return {name: read(values[name], where + name) for name, (read, _) in schema.items()
            if name in values}


def _scale(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise _Invalid(f"{key} must be a number above 0 (100: percent, 1: as it is), got "
                       f"{value!r}")
    return float(value)


def _metric(values: Any, key: str) -> Metric:
    return Metric(**_fields(values, key, {"key": (_text, True), "header": (_text, True),
                                          "scale": (_scale, False)}))


def _cell(values: Any, key: str) -> Cell:
    return Cell(**_fields(values, key, {"label": (_text, True), "changes": (_changes, True),
                                        "paper": (_paper, True), "setting": (_text, False)}))


def _form(values: Any, key: str) -> Form:
    return Form(**_fields(values, key, {
        "changes": (_changes, True), "seeds": (_positive, True), "cost": (_text, True),
        "note": (_text, False), "cells": (_each(_cell), False), "orderings": (_chains, False),
        "claim": (_text, False), "setting": (_text, False)}))


_TABLE_KEYS: dict[str, tuple[_Reader, bool]] = {
    "title": (_text, True), "source": (_text, True), "setting": (_text, True),
    "position": (_positive, True), "data_layout": (_text, False),
    "metrics": (_each(_metric), False), "full": (_form, True), "quick": (_form, True),
    "cells": (_each(_cell), True)}


def _read_table(path: Path) -> tuple[int, Table]:
    """The table in `path` (named by the file) and its position."""
    values = load_file(path)  # a file that is not TOML is a ConfigError naming it
    try:
        fields = _fields(values, "", _TABLE_KEYS)
        position = fields.pop("position")
        table = Table(name=path.stem, **fields)
        # a list of paper values is read one per metric (report.table_row)
        for key, cells in (("cells", table.cells), ("full.cells", table.full.cells or ()),
                           ("quick.cells", table.quick.cells or ())):
            for i, cell in enumerate(cells):
                if isinstance(cell.paper, tuple) and len(cell.paper) != len(table.metrics):
                    raise _Invalid(f"{key}[{i}].paper must hold one value per metric "
                                   f"({len(table.metrics)}), got {len(cell.paper)}")
    except _Invalid as e:
        raise ConfigError(f"table file {str(path)!r}: {e}") from None
    return position, table


def load_tables(folder: Union[str, Path]) -> dict[str, Table]:
    """The tables in `folder`'s NAME.toml files, in the order of their positions."""
    found: dict[int, tuple[Path, Table]] = {}
    for path in sorted(Path(folder).glob("*.toml")):
        position, table = _read_table(path)
        if position in found:
            raise ConfigError(f"table file {str(path)!r}: position {position} is also "
                              f"{str(found[position][0])!r}'s")
        found[position] = (path, table)
    if not found:
        raise ConfigError(f"no table files (*.toml) in {str(folder)!r}")
    return {table.name: table for _, (_, table) in sorted(found.items())}


TABLES: dict[str, Table] = load_tables(_experiments() / "tables")


def names() -> tuple[str, ...]:
    return tuple(TABLES)


def get(name: str) -> Table:
    if name not in TABLES:
        raise choice_error("table", name, names())
    return TABLES[name]
