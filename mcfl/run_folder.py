"""The run folder: the files of a run, written as it goes and read back.

A run folder holds summary.json (the config, the final and best scores, timings, status),
rounds.csv (one row per round, flushed as the run goes, so a stopped run keeps its rounds),
clients.csv (one row per client), curves.png, and for clustered runs assignments.npz and
clients_pca.npz; checkpoints/ holds the run's checkpoint (`mcfl.checkpoint`). `RunFolder` is
the observer `mcfl.run(config, out_dir=...)` writes through; `load_run` reads a folder back
(`mcfl compare`). A folder holding a run is never mixed with another (`prepare_folder`).
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np

from mcfl.errors import DataError, McflError
from mcfl.figures import plot_curves, title_of


def json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


# The files a run folder may hold (all of them mcfl's own; checkpoints/ is a folder).
RUN_FILES = ("summary.json", "rounds.csv", "clients.csv", "curves.png", "assignments.npz",
             "clients_pca.npz", "checkpoints")


def prepare_folder(out_dir: Path, overwrite: bool, files: tuple[str, ...] = RUN_FILES,
                   flag: str = "--overwrite") -> None:
    """Make `out_dir` ready for a new run before anything runs: a folder holding another
    run's files is refused unless `overwrite`, which deletes those files (and nothing else);
    a path that is a file, or a folder that cannot be written, is an error naming it."""
    if out_dir.exists() and not out_dir.is_dir():
        raise McflError(f"the output folder {str(out_dir)!r} is a file; choose another --out")
    held = [name for name in files if (out_dir / name).exists()]
    if held and not overwrite:
        resume = " (or --resume it)" if "checkpoints" in held else ""
        raise McflError(f"{str(out_dir)!r} already holds a run ({', '.join(held)}); pass "
                        f"{flag} to replace it{resume}, or choose another --out")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in held:
            path = out_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        probe = out_dir / ".mcfl-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise McflError(f"cannot write the output folder {str(out_dir)!r}: "
                        f"{e.strerror or e}") from None


def write_summary(out_dir: Path, summary: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(json_safe(summary), indent=2) + "\n")


ROUND_COLUMNS = (
    "round",
    "seconds",
    "train_loss",
    "discrepancy",
    "local_steps",
    "accuracy_micro",
    "accuracy_macro",
    "f1_micro",
    "f1_macro",
    "test_loss",
    "comm_params_down",
    "comm_params_up",
    "comm_params_total",
)


class RoundWriter:
    """Appends one row of rounds.csv per round and flushes it, so a crash keeps the rows.

    The columns are `ROUND_COLUMNS`, then the first row's other keys, then `later_columns`:
    keys only later rows have (evaluated rounds' cluster metrics)."""

    def __init__(self, out_dir: Path, later_columns: tuple[str, ...] = ()):
        out_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(out_dir / "rounds.csv", "w", newline="")
        self._writer: Optional[csv.DictWriter] = None
        self._later = later_columns

    def append(self, row: dict[str, Any]) -> None:
        if self._writer is None:
            extra = [k for k in row if k not in ROUND_COLUMNS]
            extra += [k for k in self._later if k not in extra and k not in ROUND_COLUMNS]
            self._writer = csv.DictWriter(self._file, fieldnames=list(ROUND_COLUMNS) + extra)
            self._writer.writeheader()
        self._writer.writerow(row)
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def write_rounds(out_dir: Path, rows: list[dict[str, Any]]) -> None:
    later = tuple(dict.fromkeys(k for row in rows for k in row))
    writer = RoundWriter(out_dir, later)
    for row in rows:
        writer.append(row)
    writer.close()


def write_clients(out_dir: Path, rows: list[dict[str, Any]]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "clients.csv", "w", newline="") as f:
        if not rows:
            return
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_final(out_dir: Path, result) -> None:
    """The files of a completed run besides rounds.csv: summary.json, clients.csv,
    assignments.npz (clustered runs) and curves.png."""
    write_summary(out_dir, result.summary)
    write_clients(out_dir, result.clients)
    if result.assignments is not None:
        np.savez(out_dir / "assignments.npz", rounds=result.assignment_rounds,
                 assignments=result.assignments)
    if result.client_embedding is not None:
        np.savez(out_dir / "clients_pca.npz", algorithm=np.array(result.config.algorithm),
                 **result.client_embedding)
    plot_curves(out_dir / "curves.png", result.rounds, title=title_of(result.config))


def write_result(out_dir: Path, result) -> Path:
    """A whole run folder from a finished `RunResult`."""
    write_rounds(out_dir, result.rounds)
    write_final(out_dir, result)
    return out_dir


class RunFolder:
    """The run-folder observer of `mcfl.run`: rounds.csv grows one flushed row per round, and
    summary.json is written at the end, or when the run stops early with its status."""

    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self._writer: Optional[RoundWriter] = None

    def started(self, config, later_columns) -> None:
        self._writer = RoundWriter(self.out_dir, later_columns)

    def round(self, row) -> None:
        self._writer.append(row)

    def stopped(self, summary) -> None:
        self._close()
        write_summary(self.out_dir, summary)

    def finished(self, result) -> None:
        self._close()
        write_final(self.out_dir, result)

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def load_run(folder: Path) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """A run folder's summary and its rounds (numbers parsed; empty cells dropped)."""
    summary_path, rounds_path = folder / "summary.json", folder / "rounds.csv"
    for path in (summary_path, rounds_path):
        if not path.is_file():
            raise DataError(f"{folder} is not an mcfl run folder: {path.name} is missing")
    try:
        summary = json.loads(summary_path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{summary_path} is not valid JSON: {e}") from None
    with open(rounds_path) as f:
        rounds = [
            {k: float(v) for k, v in row.items() if v not in ("", None) and k != "cluster_sizes"}
            for row in csv.DictReader(f)
        ]
    return summary, rounds
