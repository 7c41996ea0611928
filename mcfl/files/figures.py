"""Figures: where they may be written, and the curves of runs (accuracy and loss per round).

matplotlib is imported inside the functions that draw: `import mcfl` stays quick without it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mcfl.errors import McflError
from mcfl.files.atomic import replace_file

FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def check_figure_path(path: Path, flag: str = "--out") -> Path:
    """A path a figure can be written to: its suffix one of `FIGURE_SUFFIXES`, not a folder
    (checked before the work that makes the figure)."""
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
    try:  # written whole (mcfl.files.atomic): a stop never leaves half an image
        replace_file(path, lambda f: fig.savefig(f, format=path.suffix[1:].lower(), dpi=110))
    finally:
        plt.close(fig)
    return path


def plot_curves(path: Path, rows: list[dict[str, Any]], title: str = "") -> None:
    """Accuracy (micro and macro) and losses per round, one PNG."""
    plot_runs(path, {"": rows}, title)


def _epsilon_axis(ax, runs: dict[str, list[dict[str, Any]]]) -> None:
    """DP runs: the epsilon spent after each round, dotted, on a second axis of `ax`."""
    spent = {label: [r for r in rows if r.get("dp_epsilon") is not None
                     and math.isfinite(r["dp_epsilon"])] for label, rows in runs.items()}
    if not any(spent.values()):
        return
    twin = ax.twinx()
    for label, rows in spent.items():
        if rows:
            twin.plot([r["round"] for r in rows], [r["dp_epsilon"] for r in rows], ":",
                      color="gray", label=f"{label + ' ' if label else ''}epsilon")
    twin.set_ylabel("epsilon spent (dotted)")


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
    _epsilon_axis(ax_acc, runs)
    ax_acc.set(xlabel="round", ylabel="test accuracy", title="accuracy")
    ax_loss.set(xlabel="round", ylabel="cross-entropy", title="loss", yscale="log")
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    save_figure(fig, path)
