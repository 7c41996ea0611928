"""What an output folder holds: a run, a sweep, a reproduced table, a bench record, a select-k
search or an exported dataset, each told by the file its command writes first (`MARKERS`).

Every command that writes a folder checks it first (`check_kind`): a folder holding another
kind's results is refused in one line, with or without --overwrite, and nothing in it is
touched, so that no command writes over (or mixes its files with) another command's results.
Each kind's files (`FILES`) are the only ones its --overwrite deletes or replaces.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from mcfl.errors import McflError

# The files (and folders) of each kind; the first is its marker, written when it starts.
FILES = {
    "sweep": ("sweep.json", "members.csv", "rounds.csv", "summary.csv", "curves.png",
              "privacy.png", "checkpoints"),
    "table": ("reproduce.json", "table.md", "table.csv", "table.png", "cells"),
    "bench": ("bench.json", "bench.png", "summary.md"),
    "select-k": ("select_k.json", "select_k.csv", "select_k.png"),
    "export": ("mcfl_export.json", "train", "test", "data.npz", "true_cluster.json"),
    # A run's settings file is written at its start; a folder from before there was one has
    # its summary or checkpoint (or, killed early, only rounds.csv).
    "run": ("run.json", "summary.json", "rounds.csv", "clients.csv", "curves.png",
            "assignments.npz", "clients_pca.npz", "checkpoints", "client_store"),
}
# The marker files, the other kinds' first: a sweep also holds rounds.csv and checkpoints/.
MARKERS = {kind: files[0] for kind, files in FILES.items() if kind != "run"}
RUN_MARKERS = ("run.json", "summary.json", "checkpoints", "rounds.csv")

NAMES = {"run": "a run", "sweep": "a sweep", "table": "a reproduced table",
         "bench": "a bench record", "select-k": "a select-k search",
         "export": "an exported dataset"}
COMMANDS = {"run": "mcfl run", "sweep": "mcfl sweep", "table": "mcfl reproduce",
            "bench": "mcfl bench", "select-k": "mcfl select-k", "export": "mcfl data export"}
# What continues each kind after a stop (those that can be continued).
RESUMES = {"run": "mcfl run --resume", "sweep": "mcfl sweep --resume",
           "table": "mcfl reproduce --resume"}


def folder_kind(folder: Path) -> Optional[str]:
    """The kind of results `folder` holds, None if it holds none (or does not exist)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    for kind, marker in MARKERS.items():
        if (folder / marker).exists():
            return kind
    if any((folder / name).exists() for name in RUN_MARKERS):
        return "run"
    return None


def marker(folder: Path, kind: str) -> str:
    """The file that shows `folder` holds `kind`'s results."""
    if kind != "run":
        return MARKERS[kind]
    return next((name for name in RUN_MARKERS if (Path(folder) / name).exists()), "run.json")


# The file whose "status" says how the folder's run, sweep or table ended (or that it runs).
STATUS_FILES = {"run": "summary.json", "sweep": "sweep.json", "table": "reproduce.json"}


def status(folder: Path, kind: str) -> Optional[str]:
    """"running", "interrupted", "completed", ... as `kind`'s status file records it; None
    without one (a run killed before its summary, a kind that records none)."""
    path = Path(folder) / STATUS_FILES.get(kind, FILES[kind][0])
    try:
        found = json.loads(path.read_text()).get("status") if path.is_file() else None
    except (ValueError, AttributeError, UnicodeDecodeError, OSError):
        return None
    return found if isinstance(found, str) else None


def check_kind(folder: Path, kind: str, resuming: bool = False) -> None:
    """Refuse `folder` for `kind`'s results (or, `resuming`, for continuing them) if it holds
    another kind's: one line naming what it holds and what to do with it; nothing touched."""
    held = folder_kind(folder)
    if held is None or held == kind:
        return
    what = f"{str(folder)!r} holds {NAMES[held]} ({marker(folder, held)}), not {NAMES[kind]}"
    again = (f"continue it with {RESUMES[held]} {folder}"
             if held in RESUMES and status(folder, held) != "completed" else "")
    if resuming:
        raise McflError(f"{what}: " + (again or f"it is {COMMANDS[held]}'s, and there is no "
                                       f"{NAMES[kind][2:]} in it to resume"))
    raise McflError(f"{what}: {COMMANDS[kind]} neither writes into it nor replaces it, with or "
                    f"without --overwrite (it is {COMMANDS[held]}'s"
                    + (f"; {again}" if again else "") + "); choose another --out")
