"""A reproduced table's report: each cell's line (its sweep's summary in percent, beside the
paper's values), table.md, table.csv, reproduce.json and the bar plot table.png."""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from mcfl.config import RunConfig
from mcfl.files.atomic import write_csv, write_json, write_text
from mcfl.files.figures import save_figure
from mcfl.reproduce.tables import PAPER_RULE, Cell, Metric, Table, experiment


def shown_settings(table: Table, cell: Cell, quick: bool = False) -> dict[str, Any]:
    """A cell's own settings, as table.md lists them: its changes, and for a cell on a part of
    its own, where that part's file differs from the table's (but not what the form sets for
    every cell: the quick form's fewer rounds replace the part's own)."""
    if cell.setting in (None, table.setting):
        return dict(cell.changes)
    mine, base = experiment(cell.setting), experiment(table.setting)
    form = table.form(quick).changes
    return {**{k: v for k, v in mine.items() if base.get(k) != v and k not in form},
            **cell.changes}


def table_row(table: Table, cell: Cell, result, seconds: float, quick: bool = False) -> dict:
    """The cell's line: its sweep's summary over seeds (one grid point), in percent (or the
    metric's own scale), for each metric of the table; the first metric's values also at the
    top level."""
    metrics: tuple[Metric, ...] = table.metrics
    point = result.summary[0] if result.summary else {}

    def percent(key, scale=100.0):  # None where the summary has no (finite) value
        value = point.get(key)
        return None if value is None or math.isnan(value) else scale * value

    done = [m for m in result.members if m["status"] == "completed"]
    scored = []
    for metric, paper in zip(metrics, cell.paper_values(len(metrics))):
        mean = percent(f"{metric.key}_mean", metric.scale)
        scored.append({
            "metric": metric.key, "header": metric.header, "paper": paper, "mcfl_mean": mean,
            "mcfl_std": percent(f"{metric.key}_std", metric.scale),
            "difference": None if mean is None or paper is None else mean - paper,
            "per_seed": [round(metric.scale * m[metric.key], 2) for m in done
                         if m.get(metric.key) is not None]})
    first = scored[0]
    return {"cell": cell.label, "paper": first["paper"], "mcfl_mean": first["mcfl_mean"],
            "mcfl_std": first["mcfl_std"], "difference": first["difference"],
            "seeds_scored": len(first["per_seed"]), "members": len(result.members),
            "per_seed": first["per_seed"], "metrics": scored,
            "mcfl_best_mean": percent("best_accuracy_micro_mean"),
            "cluster_ari_mean": percent("cluster_ari_mean", scale=1.0),
            "settings": shown_settings(table, cell, quick),  # its own; the rest is the base's
            "seconds": round(seconds, 1)}


def _units(metrics) -> str:
    """How the table's columns are scaled: in percent, save the ones shown as they are."""
    plain = [m.header for m in metrics if m.scale == 1.0]
    return "in percent" + (f" ({', '.join(plain)} as it is)" if plain else "")


def _fmt(value, spec=".1f") -> str:
    return "-" if value is None else format(value, spec)


def _mean_std(entry: dict) -> str:
    return _fmt(entry["mcfl_mean"]) + ("" if entry["mcfl_std"] is None
                                       else f" +/- {entry['mcfl_std']:.1f}")


def _settings(row: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in row["settings"].items()) or "base"


def format_markdown(table: Table, quick: bool, base: RunConfig, seeds: list[int],
                    rows: list[dict], wall: float) -> str:
    form = table.form(quick)
    shown_form = f"quick form ({form.note})" if quick else "full protocol"
    scoring = ("the paper's rule (best micro accuracy over evaluated rounds once every client is "
               "in a group; FlexCFL Sec. 5.1)" if table.metrics == (PAPER_RULE,) else
               "the last round's " + ", ".join(m.header for m in table.metrics))
    lines = [f"# {table.title}", "",
             f"Source: {table.source}. Form: {shown_form}. Seeds: {', '.join(map(str, seeds))} "
             f"(training: initial models, sampling, batches; every seed trains on the data "
             f"of seed {base.seed}).",
             f"Command: `mcfl reproduce {table.name}{' --quick' if quick else ''} "
             f"--seeds {len(seeds)}`. Wall time: {wall:.0f} s on {platform.node() or 'this'} "
             f"({platform.processor() or platform.machine()}).",
             "",
             f"Score: {scoring}, {_units(table.metrics)}, mean +/- sample std over seeds; "
             f"'mcfl best' is "
             "mcfl's own best micro accuracy (every evaluated round, every client with its "
             "model).", ""]
    if table.metrics == (PAPER_RULE,):
        lines += ["| cell | paper | mcfl | difference | per seed | mcfl best | ARI | settings |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            lines.append(f"| {r['cell']} | {_fmt(r['paper'])} | {_mean_std(r)} | "
                         f"{_fmt(r['difference'], '+.1f')} | "
                         f"{' '.join(str(s) for s in r['per_seed']) or '-'} | "
                         f"{_fmt(r['mcfl_best_mean'])} | "
                         f"{_fmt(r['cluster_ari_mean'], '.2f')} | {_settings(r)} |")
    else:  # one column per metric: mcfl (paper, difference)
        # (the ARI column, unless the table has ARI among its metrics)
        ari = "cluster_ari" not in {m.key for m in table.metrics}
        lines += ["| cell | " + " | ".join(m.header for m in table.metrics)
                  + (" | ARI" if ari else "") + " | settings |",
                  "| --- " * (len(table.metrics) + 2 + ari) + "|"]
        for r in rows:
            entries = [_mean_std(e) + ("" if e["paper"] is None else
                                       f" ({_fmt(e['paper'])}, {_fmt(e['difference'], '+.1f')})")
                       for e in r["metrics"]]
            lines.append(f"| {r['cell']} | " + " | ".join(entries)
                         + (f" | {_fmt(r['cluster_ari_mean'], '.2f')}" if ari else "")
                         + f" | {_settings(r)} |")
        if any(e["paper"] is not None for r in rows for e in r["metrics"]):
            lines += ["", "Each entry: mcfl mean +/- std (the paper's value, difference)."]
    shown_base = ", ".join(f"{k}={v}" for k, v in base.to_dict().items()
                           if k in table.base(quick))
    lines += ["", f"Base setting: {shown_base}."]
    if form.claim:
        lines += ["", f"The paper's claim: {form.claim}."]
    lines += [ordering_line(chain, rows) for chain in form.orderings]
    return "\n".join(lines) + "\n"


def ordering_line(ordering: tuple[str, ...], rows: list[dict]) -> str:
    """Whether mcfl's means (of the table's first metric) rank the cells as the paper does
    (best first)."""
    means = {r["cell"]: r["mcfl_mean"] for r in rows}
    ranked = [c for c in ordering if means.get(c) is not None]
    if len(ranked) < 2:
        return f"The paper's ordering ({' > '.join(ordering)}): not enough cells scored here."
    holds = all(means[a] > means[b] for a, b in zip(ranked, ranked[1:]))
    shown = " > ".join(f"{c} ({means[c]:.1f})" for c in ranked)
    return (f"The paper's ordering, best first: {' > '.join(ordering)}. mcfl: {shown}: "
            + ("the same order." if holds else "NOT the same order."))


class Report:
    """A table's files in `folder`, rewritten as its cells finish: table.md and table.csv
    (each saying, until every chosen cell is done, that the table is incomplete and which
    cells are missing), reproduce.json (the table's settings, what a resumed table needs,
    and its status: running, interrupted, error, completed) and, once complete, table.png."""

    def __init__(self, folder: Path, table: Table, quick: bool, base: RunConfig,
                 seeds: list[int], labels: list[str], settings: dict[str, Any]):
        self.folder, self.table, self.quick, self.base = folder, table, quick, base
        self.seeds, self.labels, self.settings = seeds, labels, settings
        self.rows: list[dict] = []
        self.started = time.perf_counter()

    def missing(self) -> list[str]:
        done = {r["cell"] for r in self.rows}
        return [label for label in self.labels if label not in done]

    def write(self, final: bool, status: str = "running") -> dict:
        wall = time.perf_counter() - self.started
        status = "completed" if final else status
        text = format_markdown(self.table, self.quick, self.base, self.seeds, self.rows, wall)
        missing = self.missing()
        if missing:
            text = (f"**INCOMPLETE ({status}): {len(self.rows)} of {len(self.labels)} cells; "
                    f"missing: {', '.join(missing)}.** Finish it with `mcfl reproduce --resume "
                    f"{self.folder}`.\n\n" + text)
        pending = [{"cell": label, "status": "pending"} for label in missing]
        spec = {"kind": "table", "table": self.table.name, "quick": self.quick,
                "seeds": self.seeds, "base": self.base.to_dict(), "wall_seconds": wall,
                "status": status, "missing_cells": missing, **self.settings,
                "metrics": [m.key for m in self.table.metrics],
                "cells": [dataclasses.asdict(c) for c in self.table.cells_of(self.quick)]}
        # reproduce.json first while running (the folder says what it is from the start),
        # last when complete (its "completed" means every other file is written).
        if not final:
            write_json(self.folder / "reproduce.json", spec, default=str)
        write_text(self.folder / "table.md", text)
        write_csv(self.folder / "table.csv", [_csv_row(r) for r in self.rows] + pending)
        if final:
            _plot(self.folder / "table.png", self.table, self.rows)
            write_json(self.folder / "reproduce.json", spec, default=str)
        return spec


def _csv_row(row: dict) -> dict:
    """A row of table.csv: the first metric as before, every further metric flattened."""
    out = {"cell": row["cell"], "status": "completed",
           **{k: v for k, v in row.items() if k not in ("cell", "settings", "metrics")}}
    for entry in row["metrics"][1:]:
        for field in ("paper", "mcfl_mean", "mcfl_std", "difference"):
            out[f"{entry['metric']}_{field}"] = entry[field]
    return out | {"settings": json.dumps(row["settings"])}


def _plot(path: Path, table: Table, rows: list[dict]) -> None:
    """Paper beside mcfl (mean +/- std) for every cell, one panel per metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def values(key, i, empty):
        return [empty if r["metrics"][i][key] is None else r["metrics"][i][key] for r in rows]

    x = np.arange(len(rows))
    panels = len(table.metrics)
    fig, axes = plt.subplots(panels, 1, squeeze=False,
                             figsize=(max(6, 0.6 * len(rows) + 2), 4.5 * panels))
    for i, (ax, metric) in enumerate(zip(axes[:, 0], table.metrics)):
        ax.bar(x - 0.2, values("paper", i, np.nan), 0.4, label="paper")
        ax.bar(x + 0.2, values("mcfl_mean", i, np.nan), 0.4, yerr=values("mcfl_std", i, 0),
               capsize=3, label="mcfl (mean +/- std)")
        ax.set_xticks(x, [r["cell"] for r in rows], rotation=45, ha="right", fontsize=8)
        ax.set(ylabel=f"{metric.header} (%)")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].set_title(table.title[:80])
    save_figure(fig, path)
