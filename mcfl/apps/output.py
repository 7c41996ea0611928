"""Writing a run's results: summary.json, rounds.csv, clients.csv and a PNG of the curves."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path
from typing import Any, Optional


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


# The files a run folder may hold (all of them mcfl's own; checkpoints/ is a folder).
RUN_FILES = ("summary.json", "rounds.csv", "clients.csv", "curves.png", "assignments.npz",
             "clients_pca.npz", "checkpoints")


def prepare_folder(out_dir: Path, overwrite: bool, files: tuple[str, ...] = RUN_FILES,
                   flag: str = "--overwrite") -> None:
    """Make `out_dir` ready for a new run before anything runs: a folder holding another
    run's files is refused unless `overwrite`, which deletes those files (and nothing else);
    a path that is a file, or a folder that cannot be written, is an error naming it."""
    from mcfl.errors import McflError

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
    (out_dir / "summary.json").write_text(json.dumps(_json_safe(summary), indent=2) + "\n")


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


FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def check_figure_path(path: Path, flag: str = "--out") -> Path:
    """A path a figure can be written to: its suffix one of `FIGURE_SUFFIXES`, not a folder
    (checked before the work that makes the figure)."""
    from mcfl.errors import McflError

    path = Path(path)
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise McflError(f"{flag} {str(path)!r} must end in one of "
                        f"{', '.join(FIGURE_SUFFIXES)} (the figure's format)")
    if path.is_dir():
        raise McflError(f"{flag} {str(path)!r} is a folder; name the figure file")
    return path


def save_figure(fig, path: Path) -> Path:
    """Lay out `fig`, write it to `path` (a PNG unless its suffix says otherwise; its folder
    made if needed) and free it."""
    import matplotlib.pyplot as plt

    check_figure_path(path, "the figure")
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    except OSError as e:
        from mcfl.errors import McflError

        raise McflError(f"cannot write the figure {str(path)!r}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return path


def plot_curves(path: Path, rows: list[dict[str, Any]], title: str = "") -> None:
    """Accuracy (micro and macro) and losses per round, one PNG."""
    plot_runs(path, {"": rows}, title)


def plot_runs(path: Path, runs: dict[str, list[dict[str, Any]]], title: str = "") -> None:
    """Several runs' accuracy and training loss per round, side by side in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4))
    for label, rows in runs.items():
        prefix = f"{label} " if label else ""
        evaluated = [r for r in rows if r.get("accuracy_micro") is not None]
        x_eval = [r["round"] for r in evaluated]
        line = ax_acc.plot(
            x_eval, [r["accuracy_micro"] for r in evaluated], label=f"{prefix}micro"
        )[0]
        ax_acc.plot(
            x_eval,
            [r["accuracy_macro"] for r in evaluated],
            linestyle="--",
            color=line.get_color(),
            label=f"{prefix}macro",
        )
        ax_loss.plot(
            [r["round"] for r in rows],
            [r["train_loss"] for r in rows],
            color=line.get_color(),
            label=f"{prefix}train",
        )
        ax_loss.plot(
            x_eval,
            [r["test_loss"] for r in evaluated],
            linestyle="--",
            color=line.get_color(),
            label=f"{prefix}test",
        )
    ax_acc.set(xlabel="round", ylabel="test accuracy", title="accuracy")
    ax_loss.set(xlabel="round", ylabel="cross-entropy", title="loss", yscale="log")
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    save_figure(fig, path)


def title_of(config) -> str:
    return f"{config.algorithm} on {config.dataset}, {config.clients} clients, {config.model}"


def write_final(out_dir: Path, result) -> None:
    """The files of a completed run besides rounds.csv: summary.json, clients.csv,
    assignments.npz (clustered runs) and curves.png."""
    import numpy as np

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
