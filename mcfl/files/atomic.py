"""Files written whole or not at all, and write failures reported in one line.

Every file of a run folder is written to a temporary file in the same folder, synced to the
disk and renamed over its name (`replace_file`): a kill, a full disk or a folder turning
read-only leaves the previous version of the file or the new one, never a torn one. A failure
to write (a full disk, a lost permission, a read-only file system) raises `WriteError`, which
names the file and the cause (the CLI prints it in one line and exits 2).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Optional

import numpy as np

from mcfl.errors import McflError
from mcfl.files import faults

TEMPORARY_SUFFIX = ".mcfl-tmp"


class WriteError(McflError):
    """A file could not be written (ENOSPC, EACCES, EROFS, ...): names the file and the cause."""

    def __init__(self, path: Path, cause: BaseException):
        reason = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
        super().__init__(f"cannot write {str(path)!r}: {reason}")
        self.path, self.errno = Path(path), getattr(cause, "errno", None)


def temporary_name(path: Path) -> Path:
    """The hidden temporary file `path` is written through (one per process)."""
    return path.parent / f".{path.name}.{os.getpid()}{TEMPORARY_SUFFIX}"


def remove_temporaries(folder: Path) -> None:
    """Delete temporary files a killed writer left in `folder` (its own folder only)."""
    if folder.is_dir():
        for leftover in folder.glob(f".*{TEMPORARY_SUFFIX}"):
            with contextlib.suppress(OSError):
                leftover.unlink()


def replace_file(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Write `path` whole: `write(f)` fills a temporary file beside it, which is synced and
    renamed over `path`; on any failure the temporary file is removed and `path` is as it was."""
    path = Path(path)
    partial = temporary_name(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        faults.point("replace")
        os.replace(partial, path)
        sync_folder(path.parent)
    except OSError as e:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise WriteError(path, e) from None
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
    return path


def sync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (where the platform lets a folder be synced)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_text(path: Path, text: str) -> Path:
    return replace_file(path, lambda f: f.write(text.encode()))


def write_json(path: Path, document: Any, default: Optional[Callable] = None) -> Path:
    return write_text(path, json.dumps(document, indent=2, default=default) + "\n")


def csv_text(columns: Sequence[str], rows: Sequence[dict[str, Any]], header: bool = True,
             restval: Any = "") -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), restval=restval)
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_csv(path: Path, rows: Sequence[dict[str, Any]],
              columns: Optional[Sequence[str]] = None) -> Path:
    """`rows` as CSV; the columns are `columns`, or every key in order of first appearance
    (a missing value and None are empty cells)."""
    if columns is None:
        columns = list(dict.fromkeys(k for row in rows for k in row))
    cleaned = [{k: "" if v is None else v for k, v in row.items()} for row in rows]
    return write_text(path, csv_text(columns, cleaned) if columns else "")


def write_npz(path: Path, **arrays: np.ndarray) -> Path:
    return replace_file(path, lambda f: np.savez(f, **arrays))
