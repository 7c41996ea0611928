"""Write experiments/tables/clustered-benchmark.toml: every clustered algorithm (and FedAvg,
Local and the personalised ones that serve newcomers) x the four distribution shifts
(`mcfl.data.shifts`) x the datasets, each cell a sweep over the seeds.

    .venv/bin/python experiments/make_clustered_benchmark.py    # then: git diff the table

The table is generated so that its ~200 cells stay one product of three lists (here), not
hand-copied; edit the lists and run this again.
"""

from __future__ import annotations

from pathlib import Path

# (label, partition): each shift at a middle strength on 4 groups
SHIFTS = (("P(X)", "shift_x:4@1"),
          ("P(Y)", "shift_y:4@0.5"),
          ("P(Y|X)", "shift_y_given_x:4@0.5"),
          ("P(X|Y)", "shift_x_given_y:4@0.5"))
# (label, algorithm): the clustered ones, then the references
# (dp_fesem and ifca_async are FeSEM under DP and IFCA on an asynchronous clock: the privacy
# and clients-as-they-are tables hold them)
ALGORITHMS = (("FLUX", "flux"), ("CFL-GP", "cflgp"), ("IFCA", "ifca"), ("FeSEM", "fesem"),
              ("FeSEM-MA", "fesem_ma"),
              ("CFL", "cfl"), ("FedGroup", "fedgroup"), ("FlexCFL", "flexcfl"),
              ("Robust", "robust"), ("FL+HC", "flhc"), ("PACFL", "pacfl"), ("StoCFL", "stocfl"),
              ("FedSoft", "fedsoft"), ("FedEM", "fedem"), ("FedRC", "fedrc"), ("FedGWC", "fedgwc"),
              ("FedAvg", "fedavg"), ("Local", "local"), ("Ditto", "ditto"))
# (prefix, experiments/ file, the algorithms of the quick form: all, some or none)
QUICK_FMNIST = ("FLUX", "CFL-GP", "IFCA", "FeSEM", "FedAvg", "Local")
DATASETS = (("digits", "clustered_benchmark_digits", None),
            ("fmnist", "clustered_benchmark_fmnist", QUICK_FMNIST),
            ("cifar10", "clustered_benchmark_cifar10", ()))
# FedGroup's cold start samples pretrain_scale x K clients (20 x 4 by default): fewer, where
# the training clients are fewer than 80 (the digits' 32, Fashion-MNIST's 80)
PRETRAIN_SCALE = {"digits": 5, "fmnist": 10, "cifar10": 10}
# CFL splits nothing before its warm-up (20 rounds, as Sattler et al.'s code): the quick form's
# 20 rounds would end before its first split, so there it splits from round 10
QUICK_CFL_WARMUP = 10
METRICS = (("final_accuracy_micro", "Micro-Acc"), ("worst_group_accuracy", "Worst group"),
           ("cluster_ari", "ARI"), ("unseen_accuracy_micro", "Unseen acc"),
           ("unseen_cluster_ari", "Unseen ARI"))

HEADER = '''\
# A table of `mcfl reproduce` (its keys: mcfl/reproduce/tables.py), written by
# experiments/make_clustered_benchmark.py: edit that, not this.
#
# The clustered-FL benchmark: every clustered algorithm (and FedAvg, Local, Ditto) under each
# of the four distribution shifts of FLUX (Fenoglio et al., NeurIPS 2025): P(X), P(Y), P(Y|X),
# P(X|Y) (mcfl.data.shifts), 4 planted groups, every client every round, 20% of the clients
# held out of training and served at test time without their labels (mcfl.data.unseen).
# Scores: micro accuracy, the worst group's accuracy, ARI against the planted groups, and the
# held-out clients' accuracy and ARI. FLUX's own numbers are for 10 clients, LeNet-5 and its
# shift levels (REPRODUCTION.md compares where the settings meet); none is shown per cell.
'''


def cell(dataset: str, setting: str, shift: tuple, algorithm: tuple, with_setting: bool) -> str:
    label = f"{dataset} {shift[0]} {algorithm[0]}"
    folder = ', data_dir = "cifar10"' if dataset == "cifar10" else ""
    if algorithm[1] in ("fedgroup", "flexcfl"):  # its cold start samples scale x K clients
        folder += f", pretrain_scale = {PRETRAIN_SCALE[dataset]}"
    if algorithm[1] == "cfl" and not with_setting:  # its warm-up would take every round
        folder += f", cfl_warmup = {QUICK_CFL_WARMUP}"
    lines = ["[[cells]]" if with_setting else "[[quick.cells]]", f'label = "{label}"',
             f'changes = {{partition = "{shift[1]}", algorithm = "{algorithm[1]}"{folder}}}',
             "paper = [" + ", ".join('"none"' for _ in METRICS) + "]",
             f'setting = "{setting}"']
    return "\n".join(lines) + "\n"


def orderings(datasets) -> str:
    """The papers' claims as chains of cells, best first: FLUX above FedAvg under every shift
    (FLUX, Fig. "Hetero": every level above 1), CFL-GP and IFCA above FedAvg (their rotated and
    permuted experiments)."""
    chains = []
    for prefix in datasets:
        for shift, _ in SHIFTS:
            for method in ("FLUX", "CFL-GP", "IFCA"):
                chains.append(f'  ["{prefix} {shift} {method}", "{prefix} {shift} FedAvg"],')
    return "orderings = [\n" + "\n".join(chains) + "\n]"


QUICK_COST = ("21 min 14 s on 2 CPU cores (measured 2026-11-28 on an AMD EPYC, 100 cells, "
              "alone, from empty dataset and compile caches)")
QUICK_NOTE = ("20 rounds (CFL's warm-up 10); every algorithm on the digits, six on "
              "Fashion-MNIST (FLUX, CFL-GP, IFCA, FeSEM, FedAvg, Local); no CIFAR-10")
CLAIM = ("FLUX reports itself above FedAvg under all four shifts (its levels 2-8, 10 clients, "
         "LeNet-5); CFL-GP and IFCA report themselves above FedAvg on rotated and "
         "label-permuted data; none reports these settings, so no values are shown")


def table() -> str:
    metrics = ",\n".join(f'  {{key = "{k}", header = "{h}"}}' for k, h in METRICS)
    out = [HEADER, f'''
title = """\\
The clustered-FL benchmark: four distribution shifts x every clustered algorithm, unseen \\
clients at test time"""
source = "FLUX's four shifts (Fenoglio et al., NeurIPS 2025), mcfl's protocol"
setting = "clustered_benchmark_digits"
position = 8
data_layout = "cifar10/: CIFAR-10's binary version (cifar-10-batches-bin/ or its files; mcfl --dataset cifar10)"
metrics = [
{metrics},
]

[full]
changes = {{}}
seeds = 3
cost = "not yet measured"
claim = "{CLAIM}"
{orderings(("digits", "fmnist", "cifar10"))}

[quick]
changes = {{rounds = 20, eval_every = 10}}
seeds = 3
cost = "{QUICK_COST}"
note = "{QUICK_NOTE}"
claim = "{CLAIM}"
{orderings(("digits", "fmnist"))}
''']
    for prefix, setting, _ in DATASETS:
        for shift in SHIFTS:
            for algorithm in ALGORITHMS:
                out.append(cell(prefix, setting, shift, algorithm, True))
    for prefix, setting, quick in DATASETS:
        for shift in SHIFTS:
            for algorithm in ALGORITHMS:
                if quick is None or algorithm[0] in quick:
                    out.append(cell(prefix, setting, shift, algorithm, False))
    return "\n".join(out)


if __name__ == "__main__":
    path = Path(__file__).resolve().parent / "tables" / "clustered-benchmark.toml"
    path.write_text(table())
    print(f"wrote {path}")
