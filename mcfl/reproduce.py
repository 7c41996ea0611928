"""`mcfl reproduce NAME`: a paper's table, every cell a sweep over seeds, beside the paper's values.

A table is a base config (the paper's setting), its cells (each a change of the base: the
algorithm and its hyperparameters, a shift, or another dataset and model for tables over
several datasets) with the paper's values of the table's metrics, and two forms: the full
protocol and a quick form (fewer rounds, seeds or clients, or offline data, said in its note)
that runs in minutes on a 2-core CPU. Cells run one after another as `mcfl.sweep`s over the
seeds; cells on the same data share one loaded dataset. The FlexCFL tables score by the
paper's rule (`paper_best_accuracy_micro`: FlexCFL Sec. 5.1, the best micro accuracy over the
evaluated rounds once every client is in a group); the FeSEM table reports the last round's
micro / macro accuracy and F1. `run_table` writes table.md (paper, mcfl mean +/- std over
seeds, difference, settings), table.csv, a bar plot and each cell's sweep folder.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, Union

from mcfl.config import RunConfig, from_dict
from mcfl.errors import ConfigError, DataError, choice_error
from mcfl.records import PAPER_SCORE as SCORE

PaperValue = Union[None, float, tuple[Optional[float], ...]]


@dataclasses.dataclass(frozen=True)
class Metric:
    key: str  # the sweep summary's metric (`mcfl.sweeps.tables.SUMMARY_METRICS`)
    header: str  # its column in table.md


PAPER_RULE = Metric(SCORE, "accuracy (paper's rule)")
FINAL_METRICS = (Metric("final_accuracy_micro", "Micro-Acc"), Metric("final_f1_micro", "Micro-F1"),
                 Metric("final_accuracy_macro", "Macro-Acc"), Metric("final_f1_macro", "Macro-F1"))


@dataclasses.dataclass(frozen=True)
class Cell:
    label: str  # the paper's column (and row, for tables with several)
    changes: dict[str, Any]  # config changes from the table's base
    # The paper's values in percent, one per metric of the table (a float for one metric);
    # None where it reports none.
    paper: PaperValue

    def paper_values(self, count: int) -> tuple[Optional[float], ...]:
        if isinstance(self.paper, tuple):
            return self.paper
        return (self.paper,) + (None,) * (count - 1)


@dataclasses.dataclass(frozen=True)
class Form:
    """One way to run a table: its full protocol or its quick form."""

    changes: dict[str, Any]  # config changes from the table's base
    seeds: int
    cost: str  # measured or estimated (say which)
    note: str = "full protocol"  # what the form changes
    cells: Optional[tuple[Cell, ...]] = None  # None: the table's cells
    # Chains of cell labels the paper ranks best first (checked against mcfl's means in
    # table.md), and the paper's claim in words where it reports no value for this setting.
    orderings: tuple[tuple[str, ...], ...] = ()
    claim: str = ""


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    title: str
    source: str  # paper and table
    base: dict[str, Any]  # the paper's setting as config keys
    cells: tuple[Cell, ...]
    full: Form
    quick: Form
    # experiments/ files and the settings each holds (a test keeps them equal)
    config_files: tuple[tuple[str, dict[str, Any]], ...]
    metrics: tuple[Metric, ...] = (PAPER_RULE,)
    # The full form reads data from the user's --data-dir with this layout; cells name their
    # folder inside it as a relative data_dir. "": no --data-dir needed.
    data_layout: str = ""

    def form(self, quick: bool) -> Form:
        return self.quick if quick else self.full

    def cells_of(self, quick: bool) -> tuple[Cell, ...]:
        return self.form(quick).cells or self.cells


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
# parameters), lr 0.005, K = 5, and the Synthetic rows' protocol otherwise. Clients are
# scheduled as the authors' code does (round robin for the first 500 / 20 = 25 rounds, then at
# random), so every client has joined a group, and the paper's rule scores, from round 25.
_FLEXCFL_FMNIST = dict(dataset="fmnist", partition="ditto-fmnist", clients=500,
                       model="cnn-fmnist", rounds=300, clients_per_round=20, local_epochs=10,
                       batch_size=10, lr=0.005, clusters=5, eval_every=10, seed=2077,
                       score="paper", embed_clients=0, client_sampling="round_robin_first")
_TABLE3_FMNIST_PAPER = {"FedAvg": 89.2, "FedProx (mu 1)": 89.1, "IFCA": 90.9, "FeSEM": 81.3,
                        "RCC": 91.2, "RAC": 85.0, "FlexCFL": 92.6, "FlexCFL eta_g 0.1": 92.4}
_TABLE3_FMNIST_CELLS = tuple(Cell(c.label, c.changes, _TABLE3_FMNIST_PAPER[c.label])
                             for c in _TABLE3_CELLS)
_FMNIST_REDUCED = {"rounds": 50, "local_epochs": 2, "eval_every": 5}

# IFCA (Ghosh et al., 2020) Sec. 5.1, rotated MNIST: 4 clusters of clients whose images are
# rotated by 0/90/180/270 degrees, MLP 784-200-10, every client every round, 10 full-batch
# gradient steps a round at lr 0.1, 300 rounds. Here on Fashion-MNIST: 1,200 clients share its
# 70,000 images (about 58 each, 20% held out for test), where IFCA's clients of a cluster each
# draw n = 50 from all 60,000 (its m = 4,800 setting).
_IFCA_ROTATED = dict(dataset="fmnist", partition="rotated:4", clients=1200, model="mlp",
                     hidden=[200], rounds=300, clients_per_round=1.0, local_steps=10,
                     batch_size=64, lr=0.1, clusters=4, eval_every=10, seed=0, score="paper",
                     embed_clients=0)
_IFCA_QUICK = {"clients": 400, "samples_per_client": 50, "rounds": 30, "eval_every": 5}

_IFCA_CELLS = (
    Cell("IFCA", {"algorithm": "ifca"}, None),
    Cell("one global model (FedAvg)", {"algorithm": "fedavg"}, None),
    Cell("local models", {"algorithm": "local"}, None),
    Cell("FeSEM", {"algorithm": "fesem"}, None),
    Cell("FlexCFL", {"algorithm": "flexcfl"}, None),
    Cell("CFL", {"algorithm": "cfl"}, None),
)
_IFCA_ORDERING = (("IFCA", "one global model (FedAvg)", "local models"),)
_IFCA_CLAIM = ("IFCA finds the rotations and beats one global model, which beats local models "
               "(its rotated MNIST and CIFAR experiments); it reports no Fashion-MNIST values")

# FeSEM (Xie et al.) Sec. 6.1 and Table 1 (journal version: Tables 2 and 3): LEAF FEMNIST
# (3,550 writers, 62 classes) and FedCelebA (9,343 people, smiling or not), each device's data
# split 80 / 20, a CNN, FEMNIST lr 0.003 and 5 local epochs, FedCelebA lr 0.03 and 10; FedProx's
# mu 0.1. The paper gives no rounds, clients per round or batch size: 100 rounds (its Fig. 2),
# 20 clients a round (the authors' code's FedAvg) and B = 32 (the authors' code's FedSGD).
_FESEM_LEAF = dict(dataset="leaf", test_fraction=0.2, rounds=100, clients_per_round=20,
                   batch_size=32, eval_every=5, seed=0, score="mcfl", embed_clients=0)
_FESEM_PARTS = {  # data_dir: the part's folder inside --data-dir (LEAF's data/ folder)
    "FEMNIST": {"data_dir": "femnist/data", "model": "cnn-leaf", "lr": 0.003,
                "local_epochs": 5},
    "FedCelebA": {"data_dir": "celeba/data", "model": "cnn-celeba", "lr": 0.03,
                  "local_epochs": 10},
}
# The paper's baselines and FeSEM(K); K of Robust and FedCluster (at most) is not given.
_FESEM_ALGORITHMS = (
    ("NonFed", {"algorithm": "local"}),
    ("FedSGD", {"algorithm": "fedsgd"}),
    ("FedAvg", {"algorithm": "fedavg"}),
    ("FedDist", {"algorithm": "feddist"}),
    ("FedDWS", {"algorithm": "feddws"}),
    ("Robust(TKM)", {"algorithm": "robust", "clusters": 3}),
    ("FedCluster", {"algorithm": "cfl", "clusters": 4}),
    ("HypoCluster(3)", {"algorithm": "ifca", "clusters": 3}),
    ("FedDane", {"algorithm": "feddane"}),
    ("FedProx", {"algorithm": "fedprox", "mu": 0.1}),
    ("FeSEM(2)", {"algorithm": "fesem", "clusters": 2}),
    ("FeSEM(3)", {"algorithm": "fesem", "clusters": 3}),
    ("FeSEM(4)", {"algorithm": "fesem", "clusters": 4}),
    ("FeSEM-MA(3)", {"algorithm": "fesem_ma", "clusters": 3}),
)
# Micro-Acc, Micro-F1, Macro-Acc, Macro-F1 (the paper's means; its +/- are omitted here).
_FESEM_PAPER = {
    "FEMNIST": {
        "NonFed": (79.0, 67.6, 81.3, 51.0), "FedSGD": (70.1, 61.2, 71.5, 46.7),
        "FedAvg": (84.9, 67.9, 84.9, 45.4), "FedDist": (79.3, 67.5, 79.8, 50.5),
        "FedDWS": (80.4, 67.2, 80.6, 51.7), "Robust(TKM)": (78.4, 53.1, 77.6, 53.6),
        "FedCluster": (84.1, 64.3, 84.2, 64.4), "HypoCluster(3)": (82.5, 61.3, 82.2, 61.6),
        "FedDane": (40.0, 31.8, 41.7, 31.7), "FedProx": (72.6, 62.8, 74.3, 50.6),
        "FeSEM(2)": (84.8, 65.5, 84.8, 52.0), "FeSEM(3)": (87.0, 68.5, 86.9, 41.7),
        "FeSEM(4)": (90.3, 70.6, 91.0, 53.4), "FeSEM-MA(3)": (90.4, 71.4, 87.0, 64.3)},
    "FedCelebA": {
        "NonFed": (83.8, 66.0, 83.9, 67.2), "FedSGD": (75.7, 60.7, 75.6, 55.6),
        "FedAvg": (86.9, 78.0, 86.1, 54.2), "FedDist": (71.8, 61.0, 71.6, 61.1),
        "FedDWS": (73.4, 59.3, 73.4, 50.3), "Robust(TKM)": (90.1, 68.0, 90.1, 68.3),
        "FedCluster": (86.7, 67.8, 87.0, 67.8), "HypoCluster(3)": (76.1, 53.5, 72.7, 53.8),
        "FedDane": (76.6, 61.8, 75.9, 62.1), "FedProx": (83.8, 60.9, 84.9, 65.7),
        "FeSEM(2)": (89.1, 64.6, 89.0, 56.0), "FeSEM(3)": (88.1, 64.3, 87.5, 55.9),
        "FeSEM(4)": (93.6, 74.8, 94.1, 69.5), "FeSEM-MA(3)": (84.5, 64.1, 85.1, 63.0)},
}
_FESEM_CELLS = tuple(Cell(f"{part} {label}", {**part_changes, **changes},
                          _FESEM_PAPER[part][label])
                     for part, part_changes in _FESEM_PARTS.items()
                     for label, changes in _FESEM_ALGORITHMS)
# Quick form: Fashion-MNIST (offline) with 4 planted clusters of clients (images rotated by
# 0/90/180/270 degrees) and Dirichlet(0.5) label skew (the paper's non-IID option), 200
# clients of at most 100 images, an MLP 784-200-10, the FEMNIST part's epochs.
_FESEM_QUICK = {"dataset": "fmnist", "partition": "rotated:4+dirichlet:0.5", "clients": 200,
                "samples_per_client": 100, "model": "mlp", "hidden": [200], "lr": 0.05,
                "local_epochs": 5, "rounds": 40}
_FESEM_QUICK_CELLS = tuple(Cell(label, changes, None) for label, changes in _FESEM_ALGORITHMS)


def _without_data_dir(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k != "data_dir"}


TABLES: dict[str, Table] = {t.name: t for t in (
    Table("flexcfl-table3-synthetic",
          "FlexCFL Table III, Synthetic(1,1)-MCLR (no shift)",
          "Duan et al., Flexible Clustered Federated Learning, Table III",
          _FLEXCFL_SYNTHETIC, _TABLE3_CELLS,
          full=Form({}, 3, "10 min on 2 CPU cores (measured 2026-11-23 on an Intel Xeon: 610 s)"),
          quick=Form({"rounds": 60}, 2, "3 min on 2 CPU cores (measured 2026-11-24: 172 s on "
                     "an AMD EPYC, 124 s on an Intel Xeon)",
                     note="60 rounds instead of 300"),
          config_files=(("experiments/flexcfl_table3_synthetic.toml", _FLEXCFL_SYNTHETIC),)),
    Table("flexcfl-table4-synthetic",
          "FlexCFL Table IV, Synthetic(1,1)-MCLR under distribution shift "
          "(swap all / swap part / incremental)",
          "Duan et al., Flexible Clustered Federated Learning, Table IV",
          _FLEXCFL_SYNTHETIC, _TABLE4_CELLS,
          full=Form({}, 3, "23 min on 2 CPU cores (measured 2026-11-23 on an Intel Xeon: 1,398 s)"),
          quick=Form({"rounds": 60, "shift_interval": 10}, 1,
                     "3.5 min on 2 CPU cores (measured 2026-11-23 on an Intel Xeon: 204 s)",
                     note="60 rounds instead of 300 (incremental: 25% more data every 10 rounds "
                     "instead of 50)"),
          config_files=(("experiments/flexcfl_table3_synthetic.toml", _FLEXCFL_SYNTHETIC),)),
    Table("flexcfl-table3-fmnist",
          "FlexCFL Table III, FashionMNIST-CNN (no shift)",
          "Duan et al., Flexible Clustered Federated Learning, Table III",
          _FLEXCFL_FMNIST, _TABLE3_FMNIST_CELLS,
          full=Form({}, 3, "estimated 130 h on 2 CPU cores (the reduced table's time x 30 "
                    "times the local steps x 3 seeds)"),
          quick=Form(_FMNIST_REDUCED, 1, "1.5 h on 2 CPU cores (measured 2026-11-24 on an AMD "
                     "EPYC: 5,196 s, 13.6 GB peak)",
                     note="the reduced protocol: 50 rounds instead of 300 (every client is in "
                     "a group from round 25), E = 2 local epochs instead of 10, evaluated "
                     "every 5 rounds"),
          config_files=(("experiments/flexcfl_table3_fmnist.toml", _FLEXCFL_FMNIST),)),
    Table("ifca-rotated",
          "IFCA's rotated-image protocol on Fashion-MNIST (4 rotations, MLP 784-200-10)",
          "Ghosh et al., An Efficient Framework for Clustered Federated Learning, Sec. 5.1 "
          "(rotated MNIST)",
          _IFCA_ROTATED, _IFCA_CELLS,
          full=Form({}, 3, "estimated 5 h on 2 CPU cores (6 cells x 3 seeds x 300 rounds of "
                    "1,200 clients)", orderings=_IFCA_ORDERING, claim=_IFCA_CLAIM),
          quick=Form(_IFCA_QUICK, 1, "8 min on 2 CPU cores (measured 2026-11-24: 445 s on an "
                     "AMD EPYC, 463 s on an Intel Xeon)",
                     note="400 clients of 50 images each instead of 1,200 of about 58, 30 "
                     "rounds instead of 300", orderings=_IFCA_ORDERING, claim=_IFCA_CLAIM),
          config_files=(("experiments/ifca_rotated_fmnist.toml", _IFCA_ROTATED),)),
    Table("fesem-table1",
          "FeSEM Table 1: FEMNIST and FedCelebA (LEAF), micro / macro accuracy and F1",
          "Xie et al., Multi-Center Federated Learning, Table 1 (journal: Tables 2 and 3)",
          _FESEM_LEAF, _FESEM_CELLS,
          full=Form({}, 3, "needs the LEAF data and a large accelerator: NonFed, Robust and "
                    "FeSEM's start keep one model per client (all 3,550 FEMNIST writers x "
                    "6.6 M parameters: 94 GB; LEAF's usual 5% sample of writers: 4.7 GB)",
                    orderings=(("FEMNIST FeSEM(4)", "FEMNIST FedAvg"),
                               ("FedCelebA FeSEM(4)", "FedCelebA FedAvg")),
                    claim="FeSEM does best in most cases, and better with more clusters; "
                    "FeSEM(4) is above FedAvg on both datasets"),
          quick=Form(_FESEM_QUICK, 2, "4.5 min on 2 CPU cores (measured 2026-11-24 on an AMD "
                     "EPYC: 259 s)",
                     note="offline data with planted clusters: Fashion-MNIST over 200 clients "
                     "of at most 100 images, rotated by 0/90/180/270 degrees (4 true clusters) "
                     "with Dirichlet(0.5) label skew; an MLP 784-200-10 at lr 0.05 instead of "
                     "the CNNs; 40 rounds", cells=_FESEM_QUICK_CELLS,
                     orderings=(("FeSEM(4)", "FeSEM(2)"), ("FeSEM(4)", "FedAvg")),
                     claim="with 4 planted clusters, FeSEM(4) recovers them and beats FeSEM(2) "
                     "and FedAvg (the paper: more clusters do better, FeSEM(4) is best); the "
                     "paper's values are for LEAF, so none are shown"),
          config_files=tuple(
              (f"experiments/fesem_table1_{part.lower()}.toml",
               _without_data_dir({**_FESEM_LEAF, **changes}))
              for part, changes in _FESEM_PARTS.items()) + (
              ("experiments/fesem_table1_quick.toml", {**_FESEM_LEAF, **_FESEM_QUICK}),),
          metrics=FINAL_METRICS,
          data_layout="LEAF's data folder, holding femnist/data/{train,test} and "
          "celeba/data/{train,test} (plus celeba/data/raw/img_align_celeba) as LEAF's "
          "preprocessing writes them"),
)}


def names() -> tuple[str, ...]:
    return tuple(TABLES)


def get(name: str) -> Table:
    if name not in TABLES:
        raise choice_error("table", name, names())
    return TABLES[name]


def base_config(table: Table, quick: bool, overrides: Optional[dict] = None) -> RunConfig:
    values = {**table.base, **table.form(quick).changes, **(overrides or {})}
    return from_dict(values)


def cell_configs(table: Table, base: RunConfig, quick: bool = False,
                 data_dir: Optional[str] = None) -> list[tuple[Cell, RunConfig]]:
    """Every cell's config (validated before anything runs). A cell's relative data_dir is
    a folder inside `data_dir` (the user's --data-dir)."""
    out = []
    for cell in table.cells_of(quick):
        changes = dict(cell.changes)
        if "data_dir" in changes and data_dir is not None:
            changes["data_dir"] = str(Path(data_dir).expanduser() / changes["data_dir"])
        try:
            out.append((cell, base.replace(**changes)))
        except ConfigError as e:
            raise ConfigError(f"cell {cell.label!r}: {e}") from None
    return out


def select_cells(chosen: list[tuple[Cell, RunConfig]], patterns: list[str]
                 ) -> list[tuple[Cell, RunConfig]]:
    """The cells whose label matches one of `patterns` (a label, or a shell pattern such as
    'FEMNIST *'); a pattern matching none is an error naming the labels."""
    labels = [c.label for c, _ in chosen]
    for pattern in patterns:
        if not fnmatch.filter(labels, pattern):
            raise choice_error("cell", pattern, labels)
    return [(c, config) for c, config in chosen
            if any(fnmatch.fnmatchcase(c.label, p) for p in patterns)]


def _check_data_dirs(table: Table, quick: bool, data_dir: Optional[str],
                     cells: list[tuple[Cell, RunConfig]]) -> None:
    """A table reading the user's data (its full form) needs --data-dir, and each chosen
    cell's folder there; both are checked before anything runs."""
    if quick or not table.data_layout:
        return
    if data_dir is None:
        raise ConfigError(f"{table.name} reads {table.data_layout}: pass --data-dir DIR "
                          f"(its --quick form runs offline)")
    for cell, config in cells:
        if not (Path(config.data_dir) / "train").is_dir():
            raise DataError(f"cell {cell.label!r} reads {config.data_dir}/train, which does not "
                            f"exist; --data-dir must be {table.data_layout} (or choose other "
                            "cells with --cells)")


def run_table(name: str, out_dir: Path, quick: bool = False, seeds: Optional[int] = None,
              overrides: Optional[dict] = None, cache_dir=None,
              progress: Optional[Callable[[str, int, int], None]] = None,
              overwrite: bool = False, cells: Optional[list[str]] = None,
              data_dir: Optional[str] = None) -> dict[str, Any]:
    """Run every cell of table `name` (or those matching `cells`: labels or shell patterns)
    over `seeds` seeds (the form's default) and write the table; returns its rows and spec.
    `data_dir` is the table's data: for a table with a `data_layout` (fesem-table1, full form)
    the folder holding its cells' folders, for the others the base's data_dir (e.g. a folder
    with the Fashion-MNIST files). A folder already holding a table is refused unless
    `overwrite`."""
    from mcfl.apps.output import prepare_folder
    from mcfl.data import DATA_FIELDS, load_dataset
    from mcfl.sweeps import sweep

    table = get(name)
    form = table.form(quick)
    count = seeds if seeds is not None else form.seeds
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"seeds must be an integer >= 1, got {count!r}")
    overrides = dict(overrides or {})
    if data_dir is not None and not (table.data_layout and not quick):
        overrides["data_dir"] = data_dir
    base = base_config(table, quick, overrides)
    chosen = cell_configs(table, base, quick, data_dir)
    if cells is not None:
        chosen = select_cells(chosen, cells)
    _check_data_dirs(table, quick, data_dir, chosen)
    seed_list = [base.seed + i for i in range(count)]
    prepare_folder(out_dir, overwrite, ("reproduce.json", "table.md", "table.csv", "table.png"))
    started = time.perf_counter()
    rows: list[dict] = []
    dataset, data_key = None, None  # one dataset held at a time: cells of one part share it
    for i, (cell, config) in enumerate(chosen):
        if progress is not None:
            progress(cell.label, i, len(chosen))
        config = config.replace(data_seed=base.seed)  # every seed trains on one data draw
        key = tuple(str(getattr(config, k)) for k in DATA_FIELDS + ("data_seed",))
        if key != data_key:
            dataset = None  # let the previous one go before loading the next
            dataset, data_key = load_dataset(config, cache_dir), key
        if config.clients is None:  # a natural dataset (leaf): all its users
            config = config.replace(clients=dataset.num_clients)
        t0 = time.perf_counter()
        result = sweep(config, seeds=seed_list, dataset=dataset,
                       out_dir=out_dir / "cells" / slug(cell.label), overwrite=overwrite)
        rows.append(_table_row(cell, result, time.perf_counter() - t0, table.metrics))
        _write(out_dir, table, quick, base, seed_list, rows, time.perf_counter() - started,
               final=False)
    spec = _write(out_dir, table, quick, base, seed_list, rows, time.perf_counter() - started,
                  final=True)
    return {"rows": rows, "spec": spec}


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def _table_row(cell: Cell, result, seconds, metrics: tuple[Metric, ...]) -> dict:
    """The cell's line: its sweep's summary over seeds (one grid point), in percent, for each
    metric of the table; the first metric's values also at the top level."""
    point = result.summary[0] if result.summary else {}

    def percent(key, scale=100.0):  # None where the summary has no (finite) value
        value = point.get(key)
        return None if value is None or math.isnan(value) else scale * value

    done = [m for m in result.members if m["status"] == "completed"]
    scored = []
    for metric, paper in zip(metrics, cell.paper_values(len(metrics))):
        mean = percent(f"{metric.key}_mean")
        scored.append({
            "metric": metric.key, "header": metric.header, "paper": paper, "mcfl_mean": mean,
            "mcfl_std": percent(f"{metric.key}_std"),
            "difference": None if mean is None or paper is None else mean - paper,
            "per_seed": [round(100 * m[metric.key], 2) for m in done
                         if m.get(metric.key) is not None]})
    first = scored[0]
    return {"cell": cell.label, "paper": first["paper"], "mcfl_mean": first["mcfl_mean"],
            "mcfl_std": first["mcfl_std"], "difference": first["difference"],
            "seeds_scored": len(first["per_seed"]), "members": len(result.members),
            "per_seed": first["per_seed"], "metrics": scored,
            "mcfl_best_mean": percent("best_accuracy_micro_mean"),
            "cluster_ari_mean": percent("cluster_ari_mean", scale=1.0),
            "settings": dict(cell.changes),  # the cell's own settings; the rest is the base's
            "seconds": round(seconds, 1)}


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
             f"Score: {scoring}, in percent, mean +/- sample std over seeds; 'mcfl best' is "
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
        lines += ["| cell | " + " | ".join(m.header for m in table.metrics)
                  + " | ARI | settings |",
                  "| --- " * (len(table.metrics) + 3) + "|"]
        for r in rows:
            entries = [_mean_std(e) + ("" if e["paper"] is None else
                                       f" ({_fmt(e['paper'])}, {_fmt(e['difference'], '+.1f')})")
                       for e in r["metrics"]]
            lines.append(f"| {r['cell']} | " + " | ".join(entries)
                         + f" | {_fmt(r['cluster_ari_mean'], '.2f')} | {_settings(r)} |")
        if any(e["paper"] is not None for r in rows for e in r["metrics"]):
            lines += ["", "Each entry: mcfl mean +/- std (the paper's value, difference)."]
    shown_base = ", ".join(f"{k}={v}" for k, v in base.to_dict().items()
                           if k in table.base or k in form.changes)
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


def _write(out_dir: Path, table: Table, quick: bool, base: RunConfig, seeds: list[int],
           rows: list[dict], wall: float, final: bool) -> dict:
    from mcfl.sweeps.tables import write_csv

    (out_dir / "table.md").write_text(format_markdown(table, quick, base, seeds, rows, wall))
    write_csv(out_dir / "table.csv", [_csv_row(r) for r in rows])
    spec = {"table": table.name, "quick": quick, "seeds": seeds, "base": base.to_dict(),
            "wall_seconds": wall, "status": "completed" if final else "running",
            "metrics": [m.key for m in table.metrics],
            "cells": [dataclasses.asdict(c) for c in table.cells_of(quick)]}
    (out_dir / "reproduce.json").write_text(json.dumps(spec, indent=2, default=str) + "\n")
    if final:
        _plot(out_dir / "table.png", table, rows)
    return spec


def _csv_row(row: dict) -> dict:
    """A row of table.csv: the first metric as before, every further metric flattened."""
    out = {k: v for k, v in row.items() if k not in ("settings", "metrics")}
    for entry in row["metrics"][1:]:
        for field in ("paper", "mcfl_mean", "mcfl_std", "difference"):
            out[f"{entry['metric']}_{field}"] = entry[field]
    return out | {"settings": json.dumps(row["settings"])}


def _plot(path: Path, table: Table, rows: list[dict]) -> None:
    """Paper beside mcfl (mean +/- std) for every cell, one panel per metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from mcfl.apps.output import save_figure

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
