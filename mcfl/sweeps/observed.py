"""A sweep's members followed as runs of their own: per-member `mcfl.RunObserver`s.

``mcfl.sweep(..., observers=[...])`` takes factories of observers (the trackers of
`mcfl.tracking` are such): each is asked for a member's observer, ``factory.member(member,
spec)`` (`mcfl.sweeps.spec.Member`, and the sweep's spec as sweep.json holds it), before the
member's first round. That observer then hears what a run's observers hear: `started` with the
member's config, `round` with each of its rows (the rows of the chunk's padding are nobody's),
and at its end `finished` with a `mcfl.RunResult` holding its config, rows and summary (its
line of members.csv: final and best scores, status; no clients or state: a sweep keeps
neither), or `stopped` with that summary when it diverged or the sweep stopped. Observing
changes nothing of what the sweep computes or writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from mcfl.errors import ConfigError
from mcfl.runs.records import MemberRecord
from mcfl.runs.runner import RunResult
from mcfl.sweeps import tables
from mcfl.sweeps.spec import Member


def check_factories(observers: Sequence[Any]) -> tuple[Any, ...]:
    """The sweep's observer factories: each must make a member's observer (`member`)."""
    observers = tuple(observers or ())
    for observer in observers:
        if not callable(getattr(observer, "member", None)):
            raise ConfigError(f"a sweep's observers make one observer per member "
                              f"(.member(member, spec), as mcfl.tracking's trackers do); "
                              f"got {observer!r}")
    return observers


class Followers:
    """The observers of one chunk's members (`chunk`, without its padding)."""

    def __init__(self, factories: Sequence[Any], chunk: Sequence[Member],
                 spec: dict[str, Any]):
        self.chunk = list(chunk)
        self.observers = [tuple(factory.member(m, spec) for factory in factories)
                          for m in self.chunk] if factories else [() for _ in self.chunk]
        self.open = [False] * len(self.chunk)

    def started(self, later: tuple[str, ...]) -> None:
        for i, (member, observers) in enumerate(zip(self.chunk, self.observers)):
            for observer in observers:
                observer.started(member.config, later)
            self.open[i] = True

    def row(self, member: int, row: dict[str, Any]) -> None:
        if member < len(self.observers):
            for observer in self.observers[member]:
                observer.round(row)

    def ended(self, records: Sequence[MemberRecord], status: Optional[str] = None) -> None:
        """Tell each started member's observers how it ended: its record's status, or
        `status` for every member when the sweep stopped (interrupted, error)."""
        for i, (member, record) in enumerate(zip(self.chunk, records)):
            if not self.open[i]:
                continue
            self.open[i] = False
            ended = status or record.status
            summary = tables.member_row(member.index, member.point, member.seed,
                                        member.data_seed, ended, record.rows)
            for observer in self.observers[i]:
                if ended == "completed":
                    observer.finished(RunResult(member.config, summary, record.rows, [], None))
                else:
                    observer.stopped(summary)
