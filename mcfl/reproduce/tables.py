"""The papers' tables `mcfl reproduce` knows: each names its setting's file in experiments/
(the single source of its settings, also a config file for `mcfl run --config`), its cells
(a change of that setting: the algorithm and its hyperparameters, a shift, or another part of
a table over several datasets) with the paper's values, and two forms: the full protocol and
a quick form that runs in minutes on a 2-core CPU.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from pathlib import Path
from typing import Any, Optional, Union

from mcfl.config import load_file
from mcfl.errors import choice_error
from mcfl.runs.records import PAPER_SCORE as SCORE

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
    changes: dict[str, Any]  # config changes from the table's setting
    # The paper's values in percent, one per metric of the table (a float for one metric);
    # None where it reports none.
    paper: PaperValue
    # The experiments/ file of this cell's part of a table over several datasets (None: the
    # table's own)
    setting: Optional[str] = None

    def paper_values(self, count: int) -> tuple[Optional[float], ...]:
        if isinstance(self.paper, tuple):
            return self.paper
        return (self.paper,) + (None,) * (count - 1)


@dataclasses.dataclass(frozen=True)
class Form:
    """One way to run a table: its full protocol or its quick form."""

    changes: dict[str, Any]  # config changes from the table's setting
    seeds: int
    cost: str  # measured or estimated (say which)
    note: str = "full protocol"  # what the form changes
    cells: Optional[tuple[Cell, ...]] = None  # None: the table's cells
    # Chains of cell labels the paper ranks best first (checked against mcfl's means in
    # table.md), and the paper's claim in words where it reports no value for this setting.
    orderings: tuple[tuple[str, ...], ...] = ()
    claim: str = ""
    setting: Optional[str] = None  # its own experiments/ file (None: the table's)


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    title: str
    source: str  # paper and table
    setting: str  # experiments/SETTING.toml: the paper's setting as config keys
    cells: tuple[Cell, ...]
    full: Form
    quick: Form
    metrics: tuple[Metric, ...] = (PAPER_RULE,)
    # The full form reads data from the user's --data-dir with this layout; cells name their
    # folder inside it as a relative data_dir. "": no --data-dir needed.
    data_layout: str = ""

    def form(self, quick: bool) -> Form:
        return self.quick if quick else self.full

    def cells_of(self, quick: bool) -> tuple[Cell, ...]:
        return self.form(quick).cells or self.cells

    def setting_of(self, quick: bool) -> str:
        """The experiments/ file a form starts from."""
        return self.form(quick).setting or self.setting

    def base(self, quick: bool = False) -> dict[str, Any]:
        """The setting a form runs: its file's settings and the form's changes (flat keys)."""
        return {**experiment(self.setting_of(quick)), **self.form(quick).changes}

    def files(self) -> tuple[str, ...]:
        """Every experiments/ file the table reads."""
        names = [self.setting, self.full.setting, self.quick.setting,
                 *(c.setting for c in self.cells + (self.quick.cells or ()))]
        return tuple(dict.fromkeys(n for n in names if n is not None))


def experiment(name: str) -> dict[str, Any]:
    """The settings in experiments/NAME.toml (installed with mcfl as `mcfl.experiments`)."""
    return load_file(Path(str(importlib.resources.files("mcfl.experiments") / f"{name}.toml")))



# FlexCFL (Duan et al.) Sec. 5.1: Synthetic(1,1), 100 clients, MCLR 60-10, 300 rounds of 20
# clients, E = 10, B = 10, lr 0.01, K = 5 groups (Table II), seed 2077.


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

_TABLE3_FMNIST_PAPER = {"FedAvg": 89.2, "FedProx (mu 1)": 89.1, "IFCA": 90.9, "FeSEM": 81.3,
                        "RCC": 91.2, "RAC": 85.0, "FlexCFL": 92.6, "FlexCFL eta_g 0.1": 92.4}
_TABLE3_FMNIST_CELLS = tuple(Cell(c.label, c.changes, _TABLE3_FMNIST_PAPER[c.label])
                             for c in _TABLE3_CELLS)
_FMNIST_REDUCED = {"rounds": 50, "local_epochs": 2, "eval_every": 5}

# IFCA (Ghosh et al., 2020) Sec. 5.1, rotated MNIST: 4 clusters of clients whose images are
# rotated by 0/90/180/270 degrees, MLP 784-200-10, every client every round, 10 full-batch
# gradient steps a round at lr 0.1, 300 rounds. Here on Fashion-MNIST: 1,200 clients share its
# 70,000 images (about 58 each, 20% held out for test), where IFCA's clients of a cluster each
# draw n = 50 from all 60,000 (its m = 4,800 setting): experiments/ifca_rotated_fmnist.toml.
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

# experiments/fesem_table1_femnist.toml and fesem_table1_fedceleba.toml; data_dir: the part's
# folder inside --data-dir (LEAF's data/ folder).
_FESEM_PARTS = {"FEMNIST": ("fesem_table1_femnist", "femnist/data"),
                "FedCelebA": ("fesem_table1_fedceleba", "celeba/data")}
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
_FESEM_CELLS = tuple(Cell(f"{part} {label}", {"data_dir": folder, **changes},
                          _FESEM_PAPER[part][label], setting)
                     for part, (setting, folder) in _FESEM_PARTS.items()
                     for label, changes in _FESEM_ALGORITHMS)
# Quick form: Fashion-MNIST (offline) with 4 planted clusters of clients (images rotated by
# 0/90/180/270 degrees) and Dirichlet(0.5) label skew (the paper's non-IID option), 200
# clients of at most 100 images, an MLP 784-200-10, the FEMNIST part's epochs:
# experiments/fesem_table1_quick.toml.
_FESEM_QUICK_CELLS = tuple(Cell(label, changes, None) for label, changes in _FESEM_ALGORITHMS)


# The baselines recent clustered / personalised FL papers compare against, on offline planted
# clusters (experiments/clustered_baselines_fmnist.toml: Fashion-MNIST, 240 clients in 4
# clusters, MLP, 25% of clients a round) and on Synthetic(1,1): every algorithm with its
# paper's defaults, accuracy (each client with the model it is evaluated with) and ARI.
_BASELINE_ALGORITHMS = (
    ("FedAvg", {"algorithm": "fedavg"}), ("FedProx", {"algorithm": "fedprox"}),
    ("SCAFFOLD", {"algorithm": "scaffold"}), ("FedNova", {"algorithm": "fednova"}),
    ("Local", {"algorithm": "local"}), ("FedPer", {"algorithm": "fedper"}),
    ("LG-FedAvg", {"algorithm": "lg_fedavg"}), ("FedRep", {"algorithm": "fedrep"}),
    ("Ditto", {"algorithm": "ditto"}), ("APFL", {"algorithm": "apfl"}),
    ("Per-FedAvg", {"algorithm": "perfedavg"}),
    ("pFedMe", {"algorithm": "pfedme"}), ("IFCA", {"algorithm": "ifca"}),
    ("FeSEM", {"algorithm": "fesem"}), ("CFL", {"algorithm": "cfl"}),
    ("Robust", {"algorithm": "robust"}), ("FL+HC", {"algorithm": "flhc"}),
    ("PACFL", {"algorithm": "pacfl"}), ("FlexCFL", {"algorithm": "flexcfl"}),
    ("FedEM", {"algorithm": "fedem"}), ("FedSoft", {"algorithm": "fedsoft"}),
    ("FedRC", {"algorithm": "fedrc"}), ("StoCFL", {"algorithm": "stocfl"}),
)
_BASELINE_PARTS = {"rotated": ({"partition": "rotated:4"}, None),
                   "permuted": ({"partition": "permuted:4"}, None),
                   "label_swap": ({"partition": "label_swap:4"}, None),
                   "Synthetic": ({}, "clustered_baselines_synthetic")}
_BASELINE_CELLS = tuple(Cell(f"{part} {label}", {**part_changes, **changes}, (None, None),
                             setting)
                        for part, (part_changes, setting) in _BASELINE_PARTS.items()
                        for label, changes in _BASELINE_ALGORITHMS)
# What the papers claim over FedAvg on heterogeneous clients (each in its own experiments):
# IFCA (Ghosh et al.), FL+HC (Briggs et al.), PACFL (Vahidian et al.), Ditto (Li et al.),
# APFL (Deng et al.), pFedMe (Dinh et al.), FedRep (Collins et al.: also over LG-FedAvg),
# SCAFFOLD (Karimireddy et al.), FedEM (Marfoq et al.), Per-FedAvg (Fallah et al.),
# FedSoft (Ruan and Joe-Wong), FedRC (Guo et al.: also over FedEM) and StoCFL (Zeng et al.),
# checked on the planted parts.
_BASELINE_ORDERINGS = tuple(
    (f"{part} {better}", f"{part} {worse}")
    for part in ("rotated", "permuted", "label_swap")
    for better, worse in (("IFCA", "FedAvg"), ("FL+HC", "FedAvg"), ("PACFL", "FedAvg"),
                          ("Ditto", "FedAvg"), ("APFL", "FedAvg"), ("pFedMe", "FedAvg"),
                          ("FedRep", "FedAvg"), ("FedRep", "LG-FedAvg"),
                          ("SCAFFOLD", "FedAvg"), ("FedEM", "FedAvg"),
                          ("Per-FedAvg", "FedAvg"), ("FedSoft", "FedAvg"),
                          ("FedRC", "FedAvg"), ("FedRC", "FedEM"), ("StoCFL", "FedAvg")))
_BASELINE_CLAIM = ("each paper reports its method above FedAvg on heterogeneous clients "
                   "(FedRep also above LG-FedAvg, FedRC above FedEM); none reports these "
                   "settings, so no values are shown")


TABLES: dict[str, Table] = {t.name: t for t in (
    Table("flexcfl-table3-synthetic",
          "FlexCFL Table III, Synthetic(1,1)-MCLR (no shift)",
          "Duan et al., Flexible Clustered Federated Learning, Table III",
          "flexcfl_table3_synthetic", _TABLE3_CELLS,
          full=Form({}, 3, "10 min on 2 CPU cores (measured 2026-11-23 on an Intel Xeon: 610 s)"),
          quick=Form({"rounds": 60}, 2, "3 min on 2 CPU cores (measured 2026-11-24: 172 s on "
                     "an AMD EPYC, 124 s on an Intel Xeon)",
                     note="60 rounds instead of 300")),
    Table("flexcfl-table4-synthetic",
          "FlexCFL Table IV, Synthetic(1,1)-MCLR under distribution shift "
          "(swap all / swap part / incremental)",
          "Duan et al., Flexible Clustered Federated Learning, Table IV",
          "flexcfl_table3_synthetic", _TABLE4_CELLS,
          full=Form({}, 3, "23 min on 2 CPU cores (measured 2026-11-23 on an Intel Xeon: 1,398 s)"),
          quick=Form({"rounds": 60, "shift_interval": 10}, 1,
                     "3.5 min on 2 CPU cores (measured 2026-11-23 on an Intel Xeon: 204 s)",
                     note="60 rounds instead of 300 (incremental: 25% more data every 10 rounds "
                     "instead of 50)")),
    Table("flexcfl-table3-fmnist",
          "FlexCFL Table III, FashionMNIST-CNN (no shift)",
          "Duan et al., Flexible Clustered Federated Learning, Table III",
          "flexcfl_table3_fmnist", _TABLE3_FMNIST_CELLS,
          full=Form({}, 3, "estimated 130 h on 2 CPU cores (the reduced table's time x 30 "
                    "times the local steps x 3 seeds)"),
          quick=Form(_FMNIST_REDUCED, 1, "1.5 h on 2 CPU cores (measured 2026-11-24 on an AMD "
                     "EPYC: 5,196 s, 13.6 GB peak)",
                     note="the reduced protocol: 50 rounds instead of 300 (every client is in "
                     "a group from round 25), E = 2 local epochs instead of 10, evaluated "
                     "every 5 rounds")),
    Table("ifca-rotated",
          "IFCA's rotated-image protocol on Fashion-MNIST (4 rotations, MLP 784-200-10)",
          "Ghosh et al., An Efficient Framework for Clustered Federated Learning, Sec. 5.1 "
          "(rotated MNIST)",
          "ifca_rotated_fmnist", _IFCA_CELLS,
          full=Form({}, 3, "estimated 5 h on 2 CPU cores (6 cells x 3 seeds x 300 rounds of "
                    "1,200 clients)", orderings=_IFCA_ORDERING, claim=_IFCA_CLAIM),
          quick=Form(_IFCA_QUICK, 1, "8 min on 2 CPU cores (measured 2026-11-24: 445 s on an "
                     "AMD EPYC, 463 s on an Intel Xeon)",
                     note="400 clients of 50 images each instead of 1,200 of about 58, 30 "
                     "rounds instead of 300", orderings=_IFCA_ORDERING, claim=_IFCA_CLAIM)),
    Table("fesem-table1",
          "FeSEM Table 1: FEMNIST and FedCelebA (LEAF), micro / macro accuracy and F1",
          "Xie et al., Multi-Center Federated Learning, Table 1 (journal: Tables 2 and 3)",
          "fesem_table1_femnist", _FESEM_CELLS,
          full=Form({}, 3, "needs the LEAF data; NonFed, Robust and FeSEM's start keep one "
                    "model per client (3,550 FEMNIST writers x 6.6 M parameters: 94 GB, 47 GB "
                    "in bfloat16), which --client-store auto puts on disk when memory is "
                    "short (a stand-in on 2 CPU cores: 3.65 s a round of 20 clients, 43.7 GiB "
                    "on disk; BENCHMARKS.md); not run here",
                    orderings=(("FEMNIST FeSEM(4)", "FEMNIST FedAvg"),
                               ("FedCelebA FeSEM(4)", "FedCelebA FedAvg")),
                    claim="FeSEM does best in most cases, and better with more clusters; "
                    "FeSEM(4) is above FedAvg on both datasets"),
          quick=Form({}, 2, "4.5 min on 2 CPU cores (measured 2026-11-24 on an AMD "
                     "EPYC: 259 s)",
                     note="offline data with planted clusters: Fashion-MNIST over 200 clients "
                     "of at most 100 images, rotated by 0/90/180/270 degrees (4 true clusters) "
                     "with Dirichlet(0.5) label skew; an MLP 784-200-10 at lr 0.05 instead of "
                     "the CNNs; 40 rounds", cells=_FESEM_QUICK_CELLS,
                     orderings=(("FeSEM(4)", "FeSEM(2)"), ("FeSEM(4)", "FedAvg")),
                     claim="with 4 planted clusters, FeSEM(4) recovers them and beats FeSEM(2) "
                     "and FedAvg (the paper: more clusters do better, FeSEM(4) is best); the "
                     "paper's values are for LEAF, so none are shown",
                     setting="fesem_table1_quick"),
          metrics=FINAL_METRICS,
          data_layout="LEAF's data folder, holding femnist/data/{train,test} and "
          "celeba/data/{train,test} (plus celeba/data/raw/img_align_celeba) as LEAF's "
          "preprocessing writes them"),
    Table("clustered-baselines",
          "Clustered and personalised baselines on planted clusters (Fashion-MNIST rotated, "
          "permuted, label_swap; MLP) and Synthetic(1,1)",
          "the baselines of FedRC, PACFL and CFL-GP's comparisons, each with its paper's "
          "defaults",
          "clustered_baselines_fmnist", _BASELINE_CELLS,
          full=Form({}, 3, "estimated 1 h 15 min on 2 CPU cores (the quick form's time x 100 "
                    "/ 40 rounds); not run", orderings=_BASELINE_ORDERINGS,
                    claim=_BASELINE_CLAIM),
          quick=Form({"rounds": 40}, 3, "33 min on 2 CPU cores (measured 2026-11-25 on an "
                     "AMD EPYC in three parts: 1,501 s for the first 18 algorithms, 386 s for "
                     "FedEM, FedRC, FedSoft and Per-FedAvg with FedAvg, 130 s for StoCFL with "
                     "FedAvg)",
                     note="40 rounds instead of 100",
                     orderings=_BASELINE_ORDERINGS, claim=_BASELINE_CLAIM),
          metrics=(Metric("final_accuracy_micro", "Micro-Acc"), Metric("cluster_ari", "ARI"))),
)}


def names() -> tuple[str, ...]:
    return tuple(TABLES)


def get(name: str) -> Table:
    if name not in TABLES:
        raise choice_error("table", name, names())
    return TABLES[name]


