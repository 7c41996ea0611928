"""A sweep's folder: its tables written as it goes, and read back to resume it.

sweep.json is written first, when the sweep starts (its spec: config, seeds, grid, ...; its
status: running, then completed, interrupted or error; the members not yet finished), so a
stop at any moment leaves a folder that says what it is and how far it got. members.csv,
rounds.csv and summary.csv are rewritten whole after every chunk of members
(`mcfl.files.atomic`); members not yet finished are listed in members.csv with status
"pending", and summary.csv counts them per grid point, so a table read from an unfinished
sweep says it is incomplete. checkpoints/ holds the chunk under way (`mcfl.files.checkpoint`);
curves.png is drawn when the sweep completes.

A resumed sweep reads its finished members back from members.csv (their status) and
rounds.csv (their rows, every value parsed back to the number or text it was written from:
Python writes a float's shortest exact form), so its tables equal an uninterrupted sweep's.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from mcfl.errors import McflError
from mcfl.files import atomic, kinds
from mcfl.runs.records import MemberRecord
from mcfl.sweeps import tables
from mcfl.sweeps.spec import Member

SPEC_FILE = "sweep.json"
PENDING = "pending"  # a member not yet finished
# How a member that ran ended (a finished member is never run again).
FINISHED = ("completed", "diverged")


def write_tables(out: Path, spec: dict[str, Any], members: list[dict], rounds: list[dict],
                 summary: list[dict], point_names: Sequence[str], final: bool) -> None:
    """The sweep's tables and its spec, and when `final` its band plot of the completed
    members (and, for a DP sweep, its privacy-utility plot). sweep.json goes first while the
    sweep runs (the folder says what it holds from its first file on) and last when it is
    final (its "completed" means every file is)."""
    if not final:
        write_spec(out, spec)
    atomic.write_csv(out / "members.csv", members)
    atomic.write_csv(out / "rounds.csv", rounds)
    atomic.write_csv(out / "summary.csv", summary)
    if final:
        completed = {m["member"] for m in members if m["status"] == "completed"}
        tables.plot_bands([r for r in rounds if r["member"] in completed], point_names,
                          out / "curves.png")
        if tables.has_privacy(summary):
            tables.plot_privacy_utility(summary, point_names, out / "privacy.png")
        write_spec(out, spec)


def write_spec(out: Path, spec: dict[str, Any]) -> None:
    atomic.write_json(out / SPEC_FILE, {"kind": "sweep", **spec}, default=_json_default)


def _json_default(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)


def read_spec(folder: Path) -> dict[str, Any]:
    """sweep.json of the sweep in `folder`; one line naming the folder when there is none or
    it is damaged (another kind of folder: what it holds)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise McflError(f"--resume {str(folder)!r}: no such folder (it takes a sweep's folder)")
    kinds.check_kind(folder, "sweep", resuming=True)
    path = folder / SPEC_FILE
    if not path.is_file():
        raise McflError(f"{str(folder)!r} holds no sweep to resume ({SPEC_FILE} is missing)")
    try:
        spec = json.loads(path.read_text())
        if not isinstance(spec.get("config"), dict) or not isinstance(spec.get("seeds"), list):
            raise ValueError("no config or seeds")
    except (ValueError, AttributeError, UnicodeDecodeError) as e:
        raise McflError(f"{str(path)!r} is not a sweep's spec: {e}") from None
    return spec


def _value(text: str) -> Any:
    """A cell as it was written: an int, a float (Python writes floats exactly), or text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def finished_records(folder: Path, members: Sequence[Member]) -> dict[int, MemberRecord]:
    """The members of the sweep in `folder` that finished (completed or diverged), by index:
    their status from members.csv, their rows from rounds.csv. Members whose lines disagree
    with the sweep's spec (another seed or grid point) are an error: the folder was edited."""
    by_index = {m.index: m for m in members}
    statuses: dict[int, str] = {}
    for line in _read_csv(folder / "members.csv"):
        index = int(line["member"])
        if line.get("status") in FINISHED and index in by_index:
            member = by_index[index]
            if int(line["seed"]) != member.seed:
                raise McflError(f"{str(folder / 'members.csv')!r}: member {index} has seed "
                                f"{line['seed']}, the sweep's spec gives {member.seed}; the "
                                "folder was changed since the sweep wrote it")
            statuses[index] = line["status"]
    records = {index: MemberRecord(status=status) for index, status in statuses.items()}
    prefix = None
    for line in _read_csv(folder / "rounds.csv"):
        index = int(line["member"])
        if index not in records:
            continue
        if prefix is None:  # member, grid point, seed, data seed: the sweep's, not the row's
            prefix = 3 + len(by_index[index].point)
        row = {k: _value(v) for k, v in list(line.items())[prefix:] if v != ""}
        records[index].rows.append(row)
        records[index].round_seconds.append(row.get("seconds", 0.0))
    for record in records.values():
        record.comm_total = record.rows[-1].get("comm_params_total", 0) if record.rows else 0
    return records


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except (csv.Error, UnicodeDecodeError) as e:
        raise McflError(f"cannot read {str(path)!r}: {e}") from None


def member_rows(members: Sequence[Member], records: dict[int, MemberRecord]
                ) -> tuple[list[dict], list[dict]]:
    """members.csv's and rounds.csv's lines: every member in sweep order (those without a
    finished record "pending"), and the rows of those that ran."""
    lines, rounds = [], []
    for m in members:
        record = records.get(m.index)
        status = record.status if record is not None else PENDING
        rows = record.rows if record is not None else []
        lines.append(tables.member_row(m.index, m.point, m.seed, m.data_seed, status, rows))
        rounds += [{"member": m.index, **dict(m.point), "seed": m.seed,
                    "data_seed": m.data_seed, **row} for row in rows]
    return lines, rounds


def pending_members(members: Sequence[Member], records: dict[int, Any]) -> list[int]:
    return [m.index for m in members if m.index not in records]


def status(spec: Optional[dict[str, Any]]) -> Optional[str]:
    return None if spec is None else spec.get("status")
