"""The run folder's observer of `mcfl.run` (`RunFolder`): rounds.csv as the run goes, the final
files (clients.csv, assignments.npz, clients_pca.npz, curves.png, summary.json) at its end,
written through `mcfl.files.run_folder`'s atomic writers."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import numpy as np

from mcfl.files import atomic
from mcfl.files.atomic import WriteError
from mcfl.files.figures import plot_curves
from mcfl.files.run_folder import RoundWriter, write_clients, write_rounds, write_summary


def title_of(config) -> str:
    """A run's figures' title: its algorithm, dataset, clients and model."""
    return f"{config.algorithm} on {config.dataset}, {config.clients} clients, {config.model}"


def write_final(out_dir: Path, result) -> None:
    """The files of a completed run besides rounds.csv: clients.csv, assignments.npz
    (clustered runs), clients_pca.npz, curves.png, and last summary.json, so that a summary
    saying "completed" means every other file is there."""
    write_clients(out_dir, result.clients)
    if result.assignments is not None:
        atomic.write_npz(out_dir / "assignments.npz", rounds=result.assignment_rounds,
                         assignments=result.assignments)
    if result.client_embedding is not None:
        atomic.write_npz(out_dir / "clients_pca.npz",
                         algorithm=np.array(result.config.algorithm), **result.client_embedding)
    plot_curves(out_dir / "curves.png", result.rounds, title=title_of(result.config))
    write_summary(out_dir, result.summary)


def write_result(out_dir: Path, result) -> Path:
    """A whole run folder from a finished `RunResult`."""
    write_rounds(out_dir, result.rounds)
    write_final(out_dir, result)
    return out_dir


class RunFolder:
    """The run-folder observer of `mcfl.run`: rounds.csv grows one row per round, and
    summary.json is written at the end, or when the run stops early with its status (if the
    folder can still be written: a stop for a full disk keeps what was written before)."""

    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self._writer: Optional[RoundWriter] = None

    def started(self, config, later_columns) -> None:
        self._writer = RoundWriter(self.out_dir, later_columns)

    def round(self, row) -> None:
        self._writer.append(row)

    def moved(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        if self._writer is not None:
            self._writer.moved(self.out_dir)

    def stopped(self, summary) -> None:
        self._close()
        with contextlib.suppress(WriteError):  # the stop's own cause is the error to report
            write_summary(self.out_dir, summary)

    def finished(self, result) -> None:
        self._close()
        write_final(self.out_dir, result)

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


