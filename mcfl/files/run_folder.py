"""The run folder: the files of a run, written as it goes and read back.

A run folder holds run.json (the settings a resumed run needs, written at its start),
summary.json (the config, the final and best scores, timings, status), rounds.csv (one row per
round, appended as the run goes, so a stopped run keeps its rounds), clients.csv (one row per
client), curves.png, and for clustered runs assignments.npz and clients_pca.npz; checkpoints/
holds the run's checkpoint (`mcfl.files.checkpoint`). Every file is written whole
(`mcfl.files.atomic`).
`RunFolder` is the observer `mcfl.run(config, out_dir=...)` writes through; `load_run` reads a
folder back (`mcfl compare`). A folder holding a run is never mixed with another
(`check_target`), and a run replacing another (--overwrite) takes its place only once it has
its first checkpoint (`RunTarget`).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, Optional

from mcfl.errors import DataError, McflError
from mcfl.files import atomic, faults, kinds
from mcfl.files.atomic import WriteError


def json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


# The files a run folder may hold (all of them mcfl's own; checkpoints/ is a folder).
SETTINGS_FILE = "run.json"
RUN_FILES = kinds.FILES["run"]


def held_files(out_dir: Path, kind: str = "run") -> list[str]:
    """The files of `kind`'s results that `out_dir` holds."""
    return [name for name in kinds.FILES[kind] if (out_dir / name).exists()]


def check_target(out_dir: Path, overwrite: bool, kind: str = "run",
                 flag: str = "--overwrite") -> None:
    """Refuse `out_dir` for new results of `kind` (`mcfl.files.kinds`) before anything runs,
    creating nothing: a path that is a file, a folder holding another kind's results (even
    with `overwrite`), a folder holding results of this kind (unless `overwrite`), a place
    that cannot be written; each an error naming it."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise McflError(f"the output folder {str(out_dir)!r} is a file; choose another --out")
    kinds.check_kind(out_dir, kind)
    recover_replacement(out_dir)
    held = held_files(out_dir, kind)
    if held and not overwrite:
        resume = ""
        if kind in kinds.RESUMES and kinds.status(out_dir, kind) != "completed" and (
                kind != "run" or "checkpoints" in held or SETTINGS_FILE in held):
            resume = f" (or continue it with {kinds.RESUMES[kind]} {out_dir})"
        raise McflError(f"{str(out_dir)!r} already holds {kinds.NAMES[kind]} "
                        f"({', '.join(held)}); pass {flag} to replace it{resume}, or choose "
                        "another --out")
    existing = next(p for p in (out_dir, *out_dir.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise McflError(f"cannot write the output folder {str(out_dir)!r}: "
                        f"{str(existing)!r} is not a writable folder")


def _remove(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


# --overwrite: the new run is written beside the old one until its first checkpoint, then
# swapped in; the swap is journaled so that a kill halfway through is finished later.
STAGING_SUFFIX = ".mcfl-new"
JOURNAL = ".mcfl-replacing"


def staging_folder(out_dir: Path) -> Path:
    return out_dir.parent / f".{out_dir.name}{STAGING_SUFFIX}"


class RunTarget:
    """The folder new results of `kind` (a run, a sweep, a table) are written to (`folder`):
    `out_dir` itself, made now (after the data were checked: a run refused for its input
    leaves no folder), or, when `out_dir` holds results being replaced (--overwrite), a hidden
    sibling that `commit` swaps in once the new results have their first checkpoint (or a
    table its first cell), so that a replacement failing before that (bad data, a model that
    does not fit, divergence in its first round, a kill) leaves the old results intact."""

    def __init__(self, out_dir: Path, kind: str = "run"):
        self.out_dir = Path(out_dir)
        self.kind = kind
        self.created = not self.out_dir.exists()
        recover_replacement(self.out_dir)
        atomic.remove_temporaries(self.out_dir)
        self.pending = bool(held_files(self.out_dir, kind))
        self.folder = staging_folder(self.out_dir) if self.pending else self.out_dir
        try:
            if self.pending and self.folder.exists():
                shutil.rmtree(self.folder)
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise WriteError(self.folder, e) from None

    def commit(self) -> None:
        """Replace the old run's files by the new run's (a no-op unless pending)."""
        if not self.pending:
            return
        names = held_files(self.folder, self.kind)
        atomic.write_json(self.out_dir / JOURNAL, {"move": names, "kind": self.kind})
        _finish_replacement(self.out_dir, names, self.kind)
        self.pending, self.folder = False, self.out_dir

    def abandon(self) -> None:
        """After a run failed: drop a replacement that failed before `commit` (the old run
        stays as it was), and a new run's files if it stopped before its first row (nothing
        to resume: the folder is left as it was found)."""
        if self.pending:
            shutil.rmtree(self.folder, ignore_errors=True)
            return
        if self.kind != "run" or (self.folder / "rounds.csv").exists() or (
                self.folder / "checkpoints").exists():
            return  # (a sweep or a table records its status from the start: it is kept)
        with contextlib.suppress(OSError):
            for name in held_files(self.folder):
                _remove(self.folder / name)
            if self.created:
                self.folder.rmdir()


def _finish_replacement(out_dir: Path, names: list[str], kind: str) -> None:
    """Move the staged files `names` over `out_dir`'s results of `kind` (those it lacks are
    deleted); safe to repeat after a kill at any point of it."""
    staging = staging_folder(out_dir)
    try:
        for name in kinds.FILES[kind]:
            if name not in names and (out_dir / name).exists():
                _remove(out_dir / name)
        for name in names:
            if (staging / name).exists():
                if (out_dir / name).exists():
                    _remove(out_dir / name)
                os.replace(staging / name, out_dir / name)
                faults.point("swap")
        atomic.sync_folder(out_dir)
        shutil.rmtree(staging, ignore_errors=True)
        (out_dir / JOURNAL).unlink()
    except OSError as e:
        raise WriteError(out_dir, e) from None


def recover_replacement(out_dir: Path) -> None:
    """Finish a replacement a kill interrupted in its swap (its journal is there), or drop one
    killed before it (its staging folder is left, without a journal)."""
    journal = out_dir / JOURNAL
    if journal.is_file():
        try:
            document = json.loads(journal.read_text())
            names, kind = document["move"], document.get("kind", "run")
            kinds.FILES[kind]
        except (ValueError, KeyError, TypeError):
            raise McflError(f"{str(journal)!r} is damaged; the replacement of the run in "
                            f"{str(out_dir)!r} cannot be finished (its new files are in "
                            f"{str(staging_folder(out_dir))!r})") from None
        _finish_replacement(out_dir, names, kind)
    elif staging_folder(out_dir).is_dir():
        shutil.rmtree(staging_folder(out_dir), ignore_errors=True)


def write_settings(out_dir: Path, settings: dict[str, Any], checkpoint_every: Optional[int],
                   plan: Optional[dict[str, Any]] = None) -> None:
    """run.json: what a resumed run needs besides its checkpoint (`settings`: the config by
    flat key; the checkpoint interval), written when the run starts, so that every stop can
    be resumed; and `plan`, what the config resolved to (every default filled in:
    `mcfl.runs.plan.Plan.describe`)."""
    atomic.write_json(out_dir / SETTINGS_FILE,
                      {"config": settings, "checkpoint_every": checkpoint_every,
                       **({} if plan is None else {"plan": plan})})


def read_settings(run_dir: Path) -> Optional[dict[str, Any]]:
    path = run_dir / SETTINGS_FILE
    if not path.is_file():
        return None
    try:
        settings = json.loads(path.read_text())
        if not isinstance(settings.get("config"), dict):
            raise ValueError("no config")
    except (ValueError, AttributeError, UnicodeDecodeError) as e:
        raise McflError(f"{str(path)!r} is not a run's settings file: {e}") from None
    return settings


def run_status(run_dir: Path) -> Optional[str]:
    """The status summary.json records ("completed", "interrupted", ...), None without one."""
    return kinds.status(run_dir, "run")


def write_summary(out_dir: Path, summary: dict[str, Any]) -> None:
    atomic.write_json(out_dir / "summary.json", json_safe(summary))


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


def round_columns(first_row: dict[str, Any], later_columns=()) -> list[str]:
    """rounds.csv's columns: `ROUND_COLUMNS`, then the first row's other keys, then
    `later_columns` (keys only later rows have: evaluated rounds' cluster metrics)."""
    extra = [k for k in first_row if k not in ROUND_COLUMNS]
    extra += [k for k in later_columns if k not in extra and k not in ROUND_COLUMNS]
    return list(ROUND_COLUMNS) + extra


class RoundWriter:
    """rounds.csv, growing one row per round as the run goes. The file appears whole with its
    header and first row (`mcfl.files.atomic`); each later row is appended in one write, so a kill
    keeps every row written; a row a full disk cut short is cut off again (the file always
    ends at a row's end) and the failure raised as `WriteError`."""

    def __init__(self, out_dir: Path, later_columns: tuple[str, ...] = ()):
        self.path = Path(out_dir) / "rounds.csv"
        self._later = later_columns
        self._columns: Optional[list[str]] = None
        self._fd: Optional[int] = None

    def append(self, row: dict[str, Any]) -> None:
        if self._columns is None:
            self._columns = round_columns(row, self._later)
            atomic.write_text(self.path, atomic.csv_text(self._columns, [row]))
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        else:
            line = atomic.csv_text(self._columns, [row], header=False).encode()
            end = os.lseek(self._fd, 0, os.SEEK_END)
            try:
                if os.write(self._fd, line) != len(line):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, end)
                raise WriteError(self.path, e) from None
        faults.point("row")

    def moved(self, out_dir: Path) -> None:
        """The file was moved (renamed) into `out_dir`; it stays open."""
        self.path = Path(out_dir) / "rounds.csv"

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def write_rounds(out_dir: Path, rows: list[dict[str, Any]]) -> None:
    later = tuple(dict.fromkeys(k for row in rows for k in row))
    columns = round_columns(rows[0], later) if rows else list(ROUND_COLUMNS)
    atomic.write_text(out_dir / "rounds.csv", atomic.csv_text(columns, rows))


def write_clients(out_dir: Path, rows: list[dict[str, Any]]) -> None:
    atomic.write_csv(out_dir / "clients.csv", rows, list(rows[0]) if rows else [])


def load_run(folder: Path) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """A run folder's summary and its rounds (numbers parsed; empty cells dropped). A run that
    has not finished (killed, or still running: run.json without summary.json) gives its
    settings as the summary, with status "unfinished" and no scores."""
    summary_path, rounds_path = folder / "summary.json", folder / "rounds.csv"
    kind = kinds.folder_kind(folder)
    if kind not in (None, "run"):
        raise DataError(f"{folder} holds {kinds.NAMES[kind]} ({kinds.marker(folder, kind)}), "
                        "not a run" + (f"; compare its cells' sweeps: {folder}/cells/*"
                                       if kind == "table" else ""))
    if not summary_path.is_file() and (folder / SETTINGS_FILE).is_file():
        summary = {"config": read_settings(folder)["config"], "status": "unfinished"}
    elif not summary_path.is_file():
        raise DataError(f"{folder} is not an mcfl run folder: summary.json is missing")
    else:
        try:
            summary = json.loads(summary_path.read_text())
        except json.JSONDecodeError as e:
            raise DataError(f"{summary_path} is not valid JSON: {e}") from None
    if not rounds_path.is_file():
        if summary.get("status") == "unfinished":
            return {**summary, "rounds_completed": 0}, []
        raise DataError(f"{folder} is not an mcfl run folder: rounds.csv is missing")
    with open(rounds_path) as f:
        rounds = [
            {k: float(v) for k, v in row.items() if v not in ("", None) and k != "cluster_sizes"}
            for row in csv.DictReader(f)
        ]
    if summary.get("status") == "unfinished":
        summary["rounds_completed"] = len(rounds)
    return summary, rounds
