"""A sweep's tidy tables and its plot.

- rounds: one row per member and round (every column of a run's rounds.csv, plus the member's
  index, grid point, seed and data seed);
- members: one row per member with its final and best metrics (as a run's summary.json
  defines them: "final" is the last evaluated round, "best" the highest over evaluated
  rounds) and how it ended;
- summary: one row per grid point over its seeds and data seeds: for each metric the mean, the
  sample standard deviation (ddof 1) and the 95% confidence interval of the mean
  (Student's t, n - 1 degrees of freedom); members that diverged are counted, not averaged,
  and so are members not yet run ("pending": the sweep stopped before them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mcfl.files.figures import save_figure
from mcfl.runs.records import EVAL_KEYS, PAPER_SCORE, outcome

SUMMARY_METRICS = tuple(f"{when}_{key}" for key in EVAL_KEYS for when in ("final", "best")) + (
    PAPER_SCORE, "final_train_loss", "cluster_ari", "cluster_nmi", "worst_group_accuracy",
    "smallest_group_accuracy", "unseen_accuracy_micro", "unseen_worst_group_accuracy",
    "unseen_cluster_ari", "dp_epsilon")


def member_row(index: int, point, seed: int, data_seed: int, status: str,
               rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A member's line of members.csv."""
    out: dict[str, Any] = {"member": index, **dict(point), "seed": seed,
                           "data_seed": data_seed, "status": status,
                           "rounds_completed": len(rows)}
    out.update(outcome(rows))
    for key in ("cluster_ari", "cluster_nmi", "worst_group_accuracy", "smallest_group_accuracy",
                "unseen_accuracy_micro", "unseen_worst_group_accuracy", "unseen_cluster_ari",
                "dp_epsilon"):  # of the last evaluated round (epsilon: the last round)
        values = [r[key] for r in rows if key in r]
        if values:
            out[key] = values[-1]
    return out


def mean_std_ci(values: Sequence[float]) -> tuple[float, float, float, float]:
    """(mean, sample std, 95% interval low, high) of `values`; with one value the spread is
    unknown (NaN)."""
    x = np.asarray(values, np.float64)
    mean = float(np.mean(x))
    if len(x) < 2:
        return mean, math.nan, math.nan, math.nan
    from scipy import stats

    std = float(np.std(x, ddof=1))
    half = float(stats.t.ppf(0.975, len(x) - 1)) * std / math.sqrt(len(x))
    return mean, std, mean - half, mean + half


def summary_rows(members: Sequence[dict[str, Any]], point_names: Sequence[str]
                 ) -> list[dict[str, Any]]:
    """One row per grid point (in sweep order) over its seeds and data seeds."""
    points: dict[tuple, list[dict]] = {}
    for m in members:
        points.setdefault(tuple(m.get(n) for n in point_names), []).append(m)
    out = []
    for point, group in points.items():
        done = [m for m in group if m["status"] == "completed"]
        row: dict[str, Any] = {**dict(zip(point_names, point)), "members": len(group),
                               "completed": len(done),
                               "pending": sum(m["status"] == "pending" for m in group),
                               "seeds": " ".join(str(m["seed"]) for m in done),
                               "data_seeds": " ".join(sorted({str(m["data_seed"])
                                                              for m in done}))}
        for metric in SUMMARY_METRICS:
            values = [m[metric] for m in done if m.get(metric) is not None]
            if not values:
                continue
            mean, std, low, high = mean_std_ci(values)
            row.update({f"{metric}_mean": mean, f"{metric}_std": std,
                        f"{metric}_ci95_low": low, f"{metric}_ci95_high": high})
        out.append(row)
    return out


def point_label(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items()) or "all members"


def plot_bands(rounds: Sequence[dict[str, Any]], point_names: Sequence[str], path: Path,
               metric: str = "accuracy_micro") -> Path:
    """Mean `metric` against the round for every grid point, with a band of +/- one standard
    deviation over the members whose `rounds` rows are given (their evaluated rounds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[tuple, dict[int, list[float]]] = {}
    for row in rounds:
        if metric in row:
            point = tuple(row.get(n) for n in point_names)
            curves.setdefault(point, {}).setdefault(int(row["round"]), []).append(row[metric])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for point, by_round in curves.items():
        xs = sorted(by_round)
        values = [np.asarray(by_round[x]) for x in xs]
        mean = np.array([v.mean() for v in values])
        std = np.array([v.std(ddof=1) if len(v) > 1 else 0.0 for v in values])
        counts = {len(v) for v in values}
        label = f"{point_label(dict(zip(point_names, point)))} (n={max(counts)})"
        (line,) = ax.plot(xs, mean, label=label)
        ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.2)
    ax.set(xlabel="round", ylabel=f"test {metric.replace('_', ' ')}",
           title="mean over seeds, band: +/- 1 std")
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def has_privacy(summary: Sequence[dict[str, Any]]) -> bool:
    """Whether a sweep's points ran with client-level DP (they have an epsilon)."""
    return any(row.get("dp_epsilon_mean") is not None for row in summary)


def plot_privacy_utility(summary: Sequence[dict[str, Any]], point_names: Sequence[str],
                         path: Path) -> Path:
    """The privacy-utility curve of a DP sweep: each point's final accuracy (mean +/- one
    std over its seeds) against the epsilon it spent, with the smallest planted group's
    accuracy beside it where the data have groups (DP's noise on a cluster's mean grows as
    z C / n_k: the small group pays first). Points that differ in settings other than the
    noise and the clipping norm (an algorithm, K) are separate curves; a point without noise
    (epsilon infinite) is drawn at the right edge."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    private = [row for row in summary if row.get("dp_epsilon_mean") is not None]
    finite = [row["dp_epsilon_mean"] for row in private if math.isfinite(row["dp_epsilon_mean"])]
    edge = 2.0 * max(finite) if finite else 1.0
    others = [n for n in point_names if n not in ("dp_noise", "dp_clip", "dp_epsilon")]
    curves: dict[tuple, list[dict]] = {}
    for row in private:
        curves.setdefault(tuple(row.get(n) for n in others), []).append(row)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, rows in curves.items():
        rows = sorted(rows, key=lambda r: r["dp_epsilon_mean"])
        xs = [r["dp_epsilon_mean"] if math.isfinite(r["dp_epsilon_mean"]) else edge
              for r in rows]
        name = point_label(dict(zip(others, key))) if others else "overall"
        for metric, style, label in (("final_accuracy_micro", "-o", name),
                                     ("smallest_group_accuracy", "--s",
                                      f"{name}: smallest group")):
            means = [r.get(f"{metric}_mean") for r in rows]
            if all(m is None for m in means):
                continue
            stds = [0.0 if not r.get(f"{metric}_std") or math.isnan(r[f"{metric}_std"])
                    else r[f"{metric}_std"] for r in rows]
            ax.errorbar(xs, [np.nan if m is None else m for m in means], yerr=stds, fmt=style,
                        capsize=3, label=label)
    ax.set_xscale("log")
    ax.set(xlabel="epsilon spent (at the run's delta; right edge: no noise)",
           ylabel="final test accuracy (micro)",
           title="privacy-utility: mean +/- 1 std over seeds")
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(fontsize=8)
    return save_figure(fig, path)
