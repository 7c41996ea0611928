"""The lifecycle every study shares, written once for `mcfl.run`, `mcfl.sweep` and, through the
sweep, `mcfl reproduce`: a run is the one-member study.

* `Destination`: the study's folder. Its kind is checked before anything runs (a folder holding
  something else, or a study of its kind without ``--overwrite``, is refused); it is made once
  the data are ready; a study replacing another is written beside it (`RunTarget`'s staging
  folder) and swapped in at its first checkpoint (`commit`, which tells whatever lives in the
  folder that it moved); a replacement that fails before then leaves the old one standing
  (`abandon`).
* `Checkpointing`: the round loop's hooks (`mcfl.runs.loop.LoopHooks`) that, after each chunk
  of rounds, save a checkpoint when it is due (every ``--checkpoint-every`` rounds or 5
  minutes, at the study's last round, after a replacement's first chunk, and when SIGINT or
  SIGTERM asked to stop, which then stops the study), and pass every row on.
* `stop_signals`: SIGINT / SIGTERM turned into a stop at the end of the chunk under way
  (`mcfl.files.checkpoint.StopRequests`), for a study with checkpoints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from mcfl.errors import McflError
from mcfl.files.checkpoint import Checkpoints, StopRequests
from mcfl.files.run_folder import RunTarget, check_target
from mcfl.runs.loop import LoopHooks


class Destination:
    """Where a study of `kind` ("run" or "sweep") writes (None: nowhere): checked now, made by
    `open` (module docstring). A resumed study writes in its own folder as it is."""

    def __init__(self, out_dir: Optional[Path], kind: str, overwrite: bool = False,
                 resuming: bool = False):
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.kind, self.resuming = kind, resuming
        self.target: Optional[RunTarget] = None
        self.folder: Optional[Path] = self.out_dir if resuming else None
        self._moved: list[Callable[[Path], None]] = []
        if self.out_dir is not None and not resuming:  # refused before anything runs
            check_target(self.out_dir, overwrite, kind)

    def open(self) -> Optional[Path]:
        """Make the folder (or, replacing a study, its staging sibling): the data are ready."""
        if self.out_dir is not None and not self.resuming:
            self.target = RunTarget(self.out_dir, self.kind)
            self.folder = self.target.folder
        return self.folder

    @property
    def replacing(self) -> bool:
        """Whether the study replaces another that still stands (not swapped in yet)."""
        return self.target is not None and self.target.pending

    def on_move(self, moved: Callable[[Path], None]) -> None:
        """Call `moved(folder)` when the study's folder becomes `folder` (`commit`)."""
        self._moved.append(moved)

    def commit(self) -> None:
        """A replacing study has its first checkpoint: swap it in (else nothing)."""
        if self.replacing:
            self.target.commit()
            self.folder = self.target.folder
            for moved in self._moved:
                moved(self.folder)

    def abandon(self, stop: BaseException) -> None:
        """The study stopped: a replacement that never swapped in is removed and the study it
        was to replace stands (said in `stop`'s message); a folder swapped in stays."""
        replacing = self.replacing
        if self.target is not None:
            self.target.abandon()
        if replacing and isinstance(stop, McflError) and stop.args:
            stop.args = (f"{stop.args[0]}; the {self.kind} it was to replace in "
                         f"{str(self.out_dir)!r} is kept",)


class Checkpointing(LoopHooks):
    """After each chunk of rounds, a checkpoint by `save(last_round, state)` when one is due
    (module docstring; `last_round`: the study's last round, always saved, or None), then the
    swap of a replacing study, then the stop a signal asked for. `passed` hears every row and
    chunk first (the observers, a progress counter, the profiler)."""

    def __init__(self, checkpoints: Optional[Checkpoints], stop_requests: Optional[StopRequests],
                 destination: Destination, save: Callable[[int, Any], None],
                 last_round: Optional[int], passed: LoopHooks):
        self.checkpoints, self.stop_requests = checkpoints, stop_requests
        self.destination, self.save, self.last_round = destination, save, last_round
        self.passed = passed

    def chunk_started(self, index: int) -> None:
        self.passed.chunk_started(index)

    def row(self, member: int, row: dict[str, Any]) -> None:
        self.passed.row(member, row)

    def chunk_finished(self, index: int, last_round: int, state) -> None:
        self.passed.chunk_finished(index, last_round, state)
        checkpoints = self.checkpoints
        requested = None if self.stop_requests is None else self.stop_requests.requested
        if checkpoints is not None and (
                requested is not None or self.destination.replacing
                or last_round == self.last_round or checkpoints.due(last_round)):
            with self.stop_requests.deferred():  # a second signal stops after the save
                self.save(last_round, state)
        if self.destination.replacing:  # (its first chunk is done, and saved if it saves)
            if checkpoints is not None:
                checkpoints.close()  # (reopened in the new folder by the next save)
            self.destination.commit()
        if requested is not None:
            raise KeyboardInterrupt(f"signal {requested}")


def stop_signals(checkpointed: bool):
    """SIGINT / SIGTERM as stop requests while the study runs, when it keeps checkpoints
    (else a plain Ctrl-C); the context gives the `StopRequests` or None."""
    return StopRequests() if checkpointed else contextlib.nullcontext()
