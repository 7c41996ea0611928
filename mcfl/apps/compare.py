"""`mcfl compare --runs DIR...`: accuracy against cumulative communication (FlexCFL Fig. 6), or
against the simulated clock (``--x sim_time``: runs with clients as they are, `mcfl.system`) or
the round (``--x round``), and a table of the runs, read back from their output folders. A
sweep's folder (`mcfl sweep`) counts as one entry per grid point: its mean over seeds, with the
standard deviation."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from mcfl.errors import DataError
from mcfl.files.figures import save_figure
from mcfl.files.run_folder import load_run
from mcfl.runs.records import outcome


def _numbers(row: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        if v in ("", None):
            continue
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = v
    return out


def _read_csv(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataError(f"{path.parent} is not a complete sweep folder: {path.name} is missing")
    with open(path) as f:
        return [_numbers(row) for row in csv.DictReader(f)]


# --x: what the plot's horizontal axis shows, and its label
X_AXES = {"comm": ("comm_params_total", "parameters communicated (down + up, cumulative)"),
          "sim_time": ("sim_time", "simulated seconds (cumulative)"),
          "round": ("round", "round")}


def load_sweep(folder: Path) -> dict[str, tuple[dict[str, Any], list[dict[str, float]]]]:
    """A sweep folder's grid points as (summary, mean rounds) entries, like runs: each
    round's accuracy, parameters sent and simulated time (where kept) averaged over seeds."""
    try:
        spec = json.loads((folder / "sweep.json").read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{folder / 'sweep.json'} is not valid JSON: {e}") from None
    names = list(spec.get("grid", {}))
    summary, rounds = _read_csv(folder / "summary.csv"), _read_csv(folder / "rounds.csv")
    entries = {}
    for row in summary:
        point = [row.get(n) for n in names]
        label = f"{folder.name}: " + (", ".join(f"{n}={_shown(v)}" for n, v in zip(names, point))
                                      or "all") + f" (n={int(row.get('completed', 0))}" + (
            f", {int(row['pending'])} not run)" if row.get("pending") else ")")
        curve: dict[float, list[dict[str, float]]] = {}
        for r in rounds:
            if [r.get(n) for n in names] == point and "accuracy_micro" in r:
                curve.setdefault(r["round"], []).append(r)
        averaged = ("comm_params_total", "accuracy_micro", "sim_time")
        mean_rounds = [{"round": x, **{k: sum(r[k] for r in v) / len(v) for k in averaged
                                       if all(k in r for r in v)}}
                       for x, v in sorted(curve.items())]
        entry = {"config": {"algorithm": row.get("algorithm", spec["config"]["algorithm"])},
                 "rounds_completed": int(mean_rounds[-1]["round"]) if mean_rounds else 0,
                 "comm_params_total": mean_rounds[-1]["comm_params_total"] if mean_rounds
                 else None}
        for key in ("final_accuracy_micro", "best_accuracy_micro", "final_accuracy_macro",
                    "cluster_ari"):
            entry[key] = row.get(f"{key}_mean")
        entry["final_accuracy_micro_std"] = row.get("final_accuracy_micro_std")
        entries[label] = (entry, mean_rounds)
    return entries


def _shown(value) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


def label_of(folder: Path, summary: dict[str, Any]) -> str:
    unfinished = (f", unfinished at round {summary.get('rounds_completed', 0)}"
                  if summary.get("status") == "unfinished" else "")
    return f"{folder.name} ({summary['config']['algorithm']}{unfinished})"


def _number(value, spec: str) -> str:
    return "-" if value is None or value != value else format(value, spec)


def _best(summary: dict[str, Any]):
    """The run's best micro accuracy by its config's score rule (mcfl's or the paper's)."""
    if summary.get("config", {}).get("score") == "paper":
        return summary.get("paper_best_accuracy_micro")
    return summary.get("best_accuracy_micro")


def format_table(runs: dict[str, tuple[dict, list]]) -> str:
    width = max([32, *map(len, runs)])  # whole labels: two runs may differ only in their path
    clock = any(s.get("sim_time") is not None for s, _ in runs.values())
    head = (f"{'run':<{width}} {'rounds':>6} {'acc micro':>9} {'std':>6} {'best':>6} "
            f"{'acc macro':>9} {'ARI':>5} {'params sent':>12} {'s/round':>8}"
            + (f" {'sim s':>10}" if clock else ""))
    lines = [head, "-" * len(head)]
    for label, (s, _) in runs.items():
        lines.append(
            f"{label:<{width}} {s.get('rounds_completed', 0):>6} "
            f"{_number(s.get('final_accuracy_micro'), '.4f'):>9} "
            f"{_number(s.get('final_accuracy_micro_std'), '.4f'):>6} "
            f"{_number(_best(s), '.4f'):>6} "
            f"{_number(s.get('final_accuracy_macro'), '.4f'):>9} "
            f"{_number(s.get('cluster_ari'), '.2f'):>5} "
            f"{_number(s.get('comm_params_total'), '.3g'):>12} "
            f"{_number(s.get('seconds_per_round'), '.3f'):>8}"
            + (f" {_number(s.get('sim_time'), '.4g'):>10}" if clock else "")
        )
    return "\n".join(lines)


def plot_accuracy_vs_communication(runs: dict[str, tuple[dict, list]], path: Path,
                                   x: str = "comm") -> Path:
    """Each run's accuracy against `x` (`X_AXES`); a run without that column (`sim_time`
    of a run without a clock) is left out of the plot and named in a `DataError` when no run
    has it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    column, label_x = X_AXES[x]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plotted = 0
    for label, (_, rounds) in runs.items():
        points = [(r[column], r["accuracy_micro"]) for r in rounds
                  if "accuracy_micro" in r and column in r]
        if points:
            ax.plot(*zip(*points), marker=".", label=label)
            plotted += 1
    if not plotted and runs:
        plt.close(fig)
        raise DataError(f"--x {x}: none of the runs has a {column} column ("
                        + ("only runs with clients as they are, e.g. --device-speeds, keep one"
                           if x == "sim_time" else "no evaluated rounds") + ")")
    title = "accuracy against " + {"comm": "communication", "sim_time": "simulated time",
                                   "round": "rounds"}[x]
    ax.set(xlabel=label_x, ylabel="test accuracy (micro)", title=title)
    ax.set_xscale("symlog" if x == "comm" else "linear")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def compare(folders: list[Path], out: Path, x: str = "comm") -> str:
    """Load the runs, plot their accuracy against `x` (`X_AXES`) to `out`, and return the
    table."""
    runs = {}
    for folder in folders:
        if (folder / "sweep.json").is_file():
            runs.update(load_sweep(folder))
            continue
        summary, rounds = load_run(folder)
        if summary.get("status") == "unfinished":  # scored from its rows so far
            summary = {**outcome(rounds), **summary}
        label = label_of(folder, summary)
        if label in runs:  # two folders of the same name and algorithm: show both, by path
            label = f"{folder} ({summary['config']['algorithm']})"
            label = label if label not in runs else f"{label} #{len(runs) + 1}"
        runs[label] = (summary, rounds)
    plot_accuracy_vs_communication(runs, out, x)
    return format_table(runs)
