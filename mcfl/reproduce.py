"""`mcfl reproduce NAME`: a paper's table, every cell a sweep over seeds, beside the paper's values.

A table is a base config (the paper's setting), its cells (each a change of the base: the
algorithm and its hyperparameters, a shift) with the paper's value, and a quick form (fewer
rounds, seeds or clients, said in `quick_note`) that runs in minutes on a 2-core CPU. Cells run
one after another as `mcfl.sweep`s over the seeds, on one shared dataset; the score is the
paper's rule (`paper_best_accuracy_micro`: FlexCFL Sec. 5.1, the best micro accuracy over the
evaluated rounds once every client is in a group). `run_table` writes table.md (paper, mcfl
mean +/- std over seeds, difference, settings), table.csv, a bar plot and each cell's sweep
folder.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from mcfl.config import RunConfig, from_dict
from mcfl.errors import ConfigError, choice_error
from mcfl.runner import PAPER_SCORE as SCORE


@dataclasses.dataclass(frozen=True)
class Cell:
    label: str  # the paper's column (and row, for tables with several)
    changes: dict[str, Any]  # config changes from the table's base
    paper: Optional[float]  # the paper's value in percent; None where it reports none


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    title: str
    source: str  # paper and table
    base: dict[str, Any]  # the paper's setting as config keys
    cells: tuple[Cell, ...]
    seeds: int  # seeds of the full form
    cost: str  # of the full form, measured or estimated (say which)
    quick: dict[str, Any]  # config changes of the quick form
    quick_seeds: int
    quick_note: str  # what the quick form reduces (besides its seeds, `quick_seeds`)
    quick_cost: str
    config_file: str  # experiments/ file holding the base setting
    # Cells the paper ranks, best first (checked against mcfl's means in table.md), and what
    # the paper's claim is where it reports no value for this exact setting.
    ordering: tuple[str, ...] = ()
    claim: str = ""


# FlexCFL (Duan et al.) Sec. 5.1: Synthetic(1,1), 100 clients, MCLR 60-10, 300 rounds of 20
# clients, E = 10, B = 10, lr 0.01, K = 5 groups (Table II), seed 2077.
_FLEXCFL_SYNTHETIC = dict(dataset="synthetic", synthetic_alpha=1.0, synthetic_beta=1.0,
                          clients=100, model="mclr", rounds=300, clients_per_round=20,
                          local_epochs=10, batch_size=10, lr=0.01, clusters=5, eval_every=5,
                          seed=2077, score="paper", embed_clients=0)

_TABLE3_CELLS = (
    Cell("FedAvg", {"algorithm": "fedavg"}, 66.9),
    Cell("FedProx (mu 1)", {"algorithm": "fedprox", "mu": 1.0}, 80.7),
    Cell("IFCA", {"algorithm": "ifca"}, 91.3),
    Cell("FeSEM", {"algorithm": "fesem"}, 77.0),
    Cell("RCC", {"algorithm": "flexcfl", "measure": "random"}, 86.0),
    # With alpha K = 20 x 5 = all 100 clients pre-trained at the cold start, no client is ever
    # a newcomer: RAC is FlexCFL here (the paper reports no RAC value for Synthetic).
    Cell("RAC", {"algorithm": "flexcfl", "newcomers": "random"}, None),
    Cell("FlexCFL", {"algorithm": "flexcfl"}, 85.6),
    Cell("FlexCFL eta_g 0.1", {"algorithm": "flexcfl", "eta_g": 0.1}, 80.3),
)

# Table IV: swap all / swap part (probability 0.05 a round) / incremental (25% more data
# every 50 rounds); FlexCFL-eta_g uses eta_g = 5.0 there.
_TABLE4_PAPER = {
    "FedAvg": ({"algorithm": "fedavg"}, (63.4, 71.1, 78.2)),
    "IFCA": ({"algorithm": "ifca"}, (89.3, 96.8, 91.6)),
    "FeSEM": ({"algorithm": "fesem"}, (57.4, 77.3, 69.4)),
    "FedGroup": ({"algorithm": "fedgroup"}, (84.4, 93.5, 89.8)),
    "FlexCFL": ({"algorithm": "flexcfl"}, (85.0, 91.7, 89.8)),
    "FlexCFL eta_g 5": ({"algorithm": "flexcfl", "eta_g": 5.0}, (58.0, 76.5, 80.2)),
}
_SHIFTS = (("swap all", {"shift": "swap_all", "shift_prob": 0.05}),
           ("swap part", {"shift": "swap_part", "shift_prob": 0.05}),
           ("incremental", {"shift": "incremental"}))  # every shift_interval (50) rounds
_TABLE4_CELLS = tuple(Cell(f"{name}, {shift}", {**changes, **shift_changes}, paper[i])
                      for name, (changes, paper) in _TABLE4_PAPER.items()
                      for i, (shift, shift_changes) in enumerate(_SHIFTS))

# FlexCFL Sec. 5.1 and Table II, FashionMNIST: 500 clients of 5 classes each (the Ditto
# recipe), per-pixel standardisation, the CNN conv32-pool-conv64-pool-fc1024 (3,274,634
# parameters), lr 0.005, K = 5, and the Synthetic rows' protocol otherwise.
_FLEXCFL_FMNIST = dict(dataset="fmnist", partition="ditto-fmnist", clients=500,
                       model="cnn-fmnist", rounds=300, clients_per_round=20, local_epochs=10,
                       batch_size=10, lr=0.005, clusters=5, eval_every=10, seed=2077,
                       score="paper", embed_clients=0)
_TABLE3_FMNIST_PAPER = {"FedAvg": 89.2, "FedProx (mu 1)": 89.1, "IFCA": 90.9, "FeSEM": 81.3,
                        "RCC": 91.2, "RAC": 85.0, "FlexCFL": 92.6, "FlexCFL eta_g 0.1": 92.4}
_TABLE3_FMNIST_CELLS = tuple(Cell(c.label, c.changes, _TABLE3_FMNIST_PAPER[c.label])
                             for c in _TABLE3_CELLS)

# IFCA (Ghosh et al., 2020) Sec. 5.1, rotated MNIST: 4 clusters of clients whose images are
# rotated by 0/90/180/270 degrees, MLP 784-200-10, every client every round, 10 full-batch
# gradient steps a round at lr 0.1, 300 rounds. Here on Fashion-MNIST: 1,200 clients share its
# 70,000 images (about 58 each, 20% held out for test), where IFCA's clients of a cluster each
# draw n = 50 from all 60,000 (its m = 4,800 setting).
_IFCA_ROTATED = dict(dataset="fmnist", partition="rotated:4", clients=1200, model="mlp",
                     hidden=[200], rounds=300, clients_per_round=1.0, local_steps=10,
                     batch_size=64, lr=0.1, clusters=4, eval_every=10, seed=0, score="paper",
                     embed_clients=0)

_IFCA_CELLS = (
    Cell("IFCA", {"algorithm": "ifca"}, None),
    Cell("one global model (FedAvg)", {"algorithm": "fedavg"}, None),
    Cell("local models", {"algorithm": "local"}, None),
    Cell("FeSEM", {"algorithm": "fesem"}, None),
    Cell("FlexCFL", {"algorithm": "flexcfl"}, None),
    Cell("CFL", {"algorithm": "cfl"}, None),
)

TABLES: dict[str, Table] = {t.name: t for t in (
    Table("flexcfl-table3-synthetic",
          "FlexCFL Table III, Synthetic(1,1)-MCLR (no shift)",
          "Duan et al., Flexible Clustered Federated Learning, Table III",
          _FLEXCFL_SYNTHETIC, _TABLE3_CELLS, seeds=3,
          cost="10 min on 2 CPU cores (measured 2026-11-23: 610 s)",
          quick={"rounds": 60}, quick_seeds=2,
          quick_note="60 rounds instead of 300",
          quick_cost="2 min on 2 CPU cores (measured 2026-11-23: 124 s)",
          config_file="experiments/flexcfl_table3_synthetic.toml"),
    Table("flexcfl-table4-synthetic",
          "FlexCFL Table IV, Synthetic(1,1)-MCLR under distribution shift "
          "(swap all / swap part / incremental)",
          "Duan et al., Flexible Clustered Federated Learning, Table IV",
          _FLEXCFL_SYNTHETIC, _TABLE4_CELLS, seeds=3,
          cost="23 min on 2 CPU cores (measured 2026-11-23: 1,398 s)",
          quick={"rounds": 60, "shift_interval": 10}, quick_seeds=1,
          quick_note="60 rounds instead of 300 (incremental: 25% more data every 10 rounds "
          "instead of 50)",
          quick_cost="3.5 min on 2 CPU cores (measured 2026-11-23: 204 s)",
          config_file="experiments/flexcfl_table3_synthetic.toml"),
    Table("flexcfl-table3-fmnist",
          "FlexCFL Table III, FashionMNIST-CNN (no shift)",
          "Duan et al., Flexible Clustered Federated Learning, Table III",
          _FLEXCFL_FMNIST, _TABLE3_FMNIST_CELLS, seeds=3,
          cost="estimated 24 h on 2 CPU cores (a round of 20 clients x 120 CNN steps: about "
          "12 s, from BENCHMARKS.md; 8 cells x 3 seeds x 300 rounds)",
          quick={"rounds": 60, "local_epochs": 2}, quick_seeds=1,
          quick_note="the reduced protocol: 60 rounds instead of 300, E = 2 local epochs "
          "instead of 10",
          quick_cost="over 1 hour on 2 CPU cores (measured 2026-11-24, 1 seed: FedAvg 397 s, "
          "IFCA 1,508 s, FlexCFL 556 s; not under 10 min: the CNN)",
          config_file="experiments/flexcfl_table3_fmnist.toml"),
    Table("ifca-rotated",
          "IFCA's rotated-image protocol on Fashion-MNIST (4 rotations, MLP 784-200-10)",
          "Ghosh et al., An Efficient Framework for Clustered Federated Learning, Sec. 5.1 "
          "(rotated MNIST)",
          _IFCA_ROTATED, _IFCA_CELLS, seeds=3,
          cost="estimated 5 h on 2 CPU cores (6 cells x 3 seeds x 300 rounds of 1,200 clients)",
          quick={"clients": 400, "samples_per_client": 50, "rounds": 30, "eval_every": 5},
          quick_seeds=1,
          quick_note="400 clients of 50 images each instead of 1,200 of about 58, 30 rounds "
          "instead of 300",
          quick_cost="8 min on 2 CPU cores (measured 2026-11-24: 463 s)",
          config_file="experiments/ifca_rotated_fmnist.toml",
          ordering=("IFCA", "one global model (FedAvg)", "local models"),
          claim="IFCA finds the rotations and beats one global model, which beats local "
          "models (its rotated MNIST and CIFAR experiments); it reports no Fashion-MNIST "
          "values"),
)}


def names() -> tuple[str, ...]:
    return tuple(TABLES)


def get(name: str) -> Table:
    if name not in TABLES:
        raise choice_error("table", name, names())
    return TABLES[name]


def base_config(table: Table, quick: bool, overrides: Optional[dict] = None) -> RunConfig:
    values = {**table.base, **(table.quick if quick else {}), **(overrides or {})}
    return from_dict(values)


def cell_configs(table: Table, base: RunConfig) -> list[tuple[Cell, RunConfig]]:
    """Every cell's config (validated before anything runs)."""
    out = []
    for cell in table.cells:
        try:
            out.append((cell, base.replace(**cell.changes)))
        except ConfigError as e:
            raise ConfigError(f"cell {cell.label!r}: {e}") from None
    return out


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def run_table(name: str, out_dir: Path, quick: bool = False, seeds: Optional[int] = None,
              overrides: Optional[dict] = None, cache_dir=None,
              progress: Optional[Callable[[str, int, int], None]] = None,
              overwrite: bool = False, cells: Optional[list[str]] = None) -> dict[str, Any]:
    """Run every cell of table `name` (or only those labelled in `cells`) over `seeds` seeds
    (the table's default for its form) and write the table; returns its rows and spec. A
    folder already holding a table is refused unless `overwrite`."""
    from mcfl.apps.output import prepare_folder
    from mcfl.data import load_dataset
    from mcfl.sweeps import sweep

    table = get(name)
    count = seeds if seeds is not None else (table.quick_seeds if quick else table.seeds)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"seeds must be an integer >= 1, got {count!r}")
    base = base_config(table, quick, overrides)
    chosen = cell_configs(table, base)
    if cells is not None:
        labels = [c.label for c, _ in chosen]
        for label in cells:
            if label not in labels:
                raise choice_error("cell", label, labels)
        chosen = [(c, config) for c, config in chosen if c.label in cells]
    cells = chosen
    seed_list = [base.seed + i for i in range(count)]
    prepare_folder(out_dir, overwrite, ("reproduce.json", "table.md", "table.csv", "table.png"))
    started = time.perf_counter()
    dataset = load_dataset(base.replace(data_seed=base.seed), cache_dir)
    rows = []
    for i, (cell, config) in enumerate(cells):
        if progress is not None:
            progress(cell.label, i, len(cells))
        t0 = time.perf_counter()
        result = sweep(config.replace(data_seed=base.seed), seeds=seed_list, dataset=dataset,
                       out_dir=out_dir / "cells" / slug(cell.label), overwrite=overwrite)
        rows.append(_table_row(cell, result, time.perf_counter() - t0))
        _write(out_dir, table, quick, base, seed_list, rows, time.perf_counter() - started,
               final=False)
    spec = _write(out_dir, table, quick, base, seed_list, rows, time.perf_counter() - started,
                  final=True)
    return {"rows": rows, "spec": spec}


def _table_row(cell: Cell, result, seconds) -> dict:
    """The cell's line: its sweep's summary over seeds (one grid point), in percent."""
    point = result.summary[0] if result.summary else {}

    def percent(key, scale=100.0):  # None where the summary has no (finite) value
        value = point.get(key)
        return None if value is None or math.isnan(value) else scale * value

    mean = percent(f"{SCORE}_mean")
    scores = [100 * m[SCORE] for m in result.members
              if m["status"] == "completed" and m.get(SCORE) is not None]
    return {"cell": cell.label, "paper": cell.paper, "mcfl_mean": mean,
            "mcfl_std": percent(f"{SCORE}_std"),
            "difference": None if mean is None or cell.paper is None else mean - cell.paper,
            "seeds_scored": len(scores), "members": len(result.members),
            "per_seed": [round(s, 2) for s in scores],
            "mcfl_best_mean": percent("best_accuracy_micro_mean"),
            "cluster_ari_mean": percent("cluster_ari_mean", scale=1.0),
            "settings": dict(cell.changes),  # the cell's own settings; the rest is the base's
            "seconds": round(seconds, 1)}


def _fmt(value, spec=".1f") -> str:
    return "-" if value is None else format(value, spec)


def format_markdown(table: Table, quick: bool, base: RunConfig, seeds: list[int],
                    rows: list[dict], wall: float) -> str:
    form = f"quick form ({table.quick_note})" if quick else "full protocol"
    lines = [f"# {table.title}", "",
             f"Source: {table.source}. Form: {form}. Seeds: {', '.join(map(str, seeds))} "
             f"(training: initial models, sampling, batches; every seed trains on the data "
             f"of seed {base.seed}).",
             f"Command: `mcfl reproduce {table.name}{' --quick' if quick else ''} "
             f"--seeds {len(seeds)}`. Wall time: {wall:.0f} s on {platform.node() or 'this'} "
             f"({platform.processor() or platform.machine()}).",
             "",
             "Score: the paper's rule (best micro accuracy over evaluated rounds once every "
             "client is in a group; FlexCFL Sec. 5.1), in percent, mean +/- sample std over "
             "seeds; 'mcfl best' is mcfl's own best (every evaluated round, every client with "
             "its model).", "",
             "| cell | paper | mcfl | difference | per seed | mcfl best | ARI | settings |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        shown = _fmt(r["mcfl_mean"]) + ("" if r["mcfl_std"] is None
                                         else f" +/- {r['mcfl_std']:.1f}")
        settings = ", ".join(f"{k}={v}" for k, v in r["settings"].items()) or "base"
        lines.append(f"| {r['cell']} | {_fmt(r['paper'])} | {shown} | "
                     f"{_fmt(r['difference'], '+.1f')} | "
                     f"{' '.join(str(s) for s in r['per_seed']) or '-'} | "
                     f"{_fmt(r['mcfl_best_mean'])} | {_fmt(r['cluster_ari_mean'], '.2f')} | "
                     f"{settings} |")
    shown_base = ", ".join(f"{k}={v}" for k, v in base.to_dict().items()
                           if k in table.base or k in table.quick)
    lines += ["", f"Base setting: {shown_base}."]
    if table.claim:
        lines += ["", f"The paper's claim: {table.claim}."]
    if table.ordering:
        lines += ["", ordering_line(table.ordering, rows)]
    return "\n".join(lines) + "\n"


def ordering_line(ordering: tuple[str, ...], rows: list[dict]) -> str:
    """Whether mcfl's means rank the cells as the paper does (best first)."""
    means = {r["cell"]: r["mcfl_mean"] for r in rows}
    ranked = [c for c in ordering if means.get(c) is not None]
    if len(ranked) < 2:
        return f"The paper's ordering ({' > '.join(ordering)}): not enough cells scored here."
    holds = all(means[a] > means[b] for a, b in zip(ranked, ranked[1:]))
    shown = " > ".join(f"{c} ({means[c]:.1f})" for c in ranked)
    return (f"The paper's ordering, best first: {' > '.join(ordering)}. mcfl: {shown}: "
            + ("the same order." if holds else "NOT the same order."))


def _write(out_dir: Path, table: Table, quick: bool, base: RunConfig, seeds: list[int],
           rows: list[dict], wall: float, final: bool) -> dict:
    from mcfl.sweeps.tables import write_csv

    (out_dir / "table.md").write_text(format_markdown(table, quick, base, seeds, rows, wall))
    write_csv(out_dir / "table.csv", [{k: v for k, v in r.items() if k != "settings"}
                                      | {"settings": json.dumps(r["settings"])} for r in rows])
    spec = {"table": table.name, "quick": quick, "seeds": seeds, "base": base.to_dict(),
            "wall_seconds": wall, "status": "completed" if final else "running",
            "cells": [dataclasses.asdict(c) for c in table.cells]}
    (out_dir / "reproduce.json").write_text(json.dumps(spec, indent=2, default=str) + "\n")
    if final:
        _plot(out_dir / "table.png", table, rows)
    return spec


def _plot(path: Path, table: Table, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from mcfl.apps.output import save_figure

    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(rows) + 2), 4.5))
    paper = [np.nan if r["paper"] is None else r["paper"] for r in rows]
    mean = [np.nan if r["mcfl_mean"] is None else r["mcfl_mean"] for r in rows]
    std = [0 if r["mcfl_std"] is None else r["mcfl_std"] for r in rows]
    ax.bar(x - 0.2, paper, 0.4, label="paper")
    ax.bar(x + 0.2, mean, 0.4, yerr=std, capsize=3, label="mcfl (mean +/- std)")
    ax.set_xticks(x, [r["cell"] for r in rows], rotation=45, ha="right", fontsize=8)
    ax.set(ylabel="accuracy (%)", title=table.title[:80])
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, path)
