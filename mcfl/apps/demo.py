"""`mcfl demo`: two small experiments that show what mcfl is for, under 3 minutes on 2 cores.

1. Baselines on Synthetic(1,1), FlexCFL's synthetic setup: 100 clients, MCLR 60 -> 10, 20
   clients a round, E = 10 local epochs of B = 10, lr = 0.01 (FlexCFL Sec. 6); FedAvg, FedProx
   (mu = 1, FedProx's recommendation for Synthetic) and Local.
2. Clustered FL on planted clusters: scikit-learn's digits over 100 clients whose labels follow
   one of 4 fixed permutations (the true cluster); FedAvg against FeSEM and IFCA with K = 4,
   every client every round, E = 5, lr = 0.1. One model cannot fit four labellings; one per
   recovered cluster can, and the adjusted Rand index says how well the clusters were found.

Each experiment builds its dataset once and shares it between its runs; every run writes its
own folder, and each experiment a comparison plot.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Optional

from mcfl.apps.progress import progress_bar
from mcfl.config import RunConfig
from mcfl.files.figures import plot_runs
from mcfl.runs.runner import load_dataset, run


class Experiment(NamedTuple):
    name: str
    title: str
    config: RunConfig
    algorithms: dict[str, dict]


EXPERIMENTS = (
    Experiment(
        "synthetic",
        "Synthetic(1,1), MCLR, 100 clients",
        RunConfig(dataset="synthetic", clients=100, rounds=100, model="mclr", lr=0.01,
                  batch_size=10, local_epochs=10, clients_per_round=20, eval_every=2,
                  seed=2077),  # FlexCFL's seed
        {"fedavg": {}, "fedprox": {"mu": 1.0}, "local": {}},
    ),
    Experiment(
        "planted",
        "digits, 4 planted label permutations, 100 clients",
        RunConfig(dataset="digits", partition="permuted:4", clients=100, rounds=40,
                  model="mclr", lr=0.1, batch_size=10, local_epochs=5, clients_per_round=1.0,
                  clusters=4, eval_every=2, seed=0),
        {"fedavg": {}, "fesem": {}, "ifca": {}},
    ),
)


def run_demo(out: Path, rounds: Optional[int] = None, clients: Optional[int] = None) -> dict:
    """Run both experiments, print their tables, save their plots; returns the summaries."""
    overrides = {k: v for k, v in (("rounds", rounds), ("clients", clients)) if v is not None}
    results = {}
    for exp in EXPERIMENTS:
        base = exp.config.replace(**overrides)
        dataset = load_dataset(base)
        print(f"\n== {exp.title}: {int(dataset.train_counts().sum())} train / "
              f"{int(dataset.test_counts().sum())} test samples, {base.rounds} rounds ==")
        summaries, curves = {}, {}
        for name, extra in exp.algorithms.items():
            config = base.replace(algorithm=name, **extra)
            # (off unless on a terminal: `mcfl demo > log` keeps its tables, not the frames)
            with progress_bar(total=config.rounds, desc=name, unit="round",
                              dynamic_ncols=True) as bar:

                def progress(r, row, bar=bar):
                    if "accuracy_micro" in row:
                        bar.set_postfix(acc=f"{row['accuracy_micro']:.3f}", refresh=False)
                    bar.update(1)

                # the demo's own folders: a new demo replaces the last one's runs
                result = run(config, out_dir=out / exp.name / name, overwrite=True,
                             progress=progress, dataset=dataset)
            summaries[name], curves[name] = result.summary, result.rounds
        plot_runs(out / f"{exp.name}.png", curves, title=exp.title)
        print(format_table(summaries))
        results[exp.name] = summaries
    print(f"\nplots: {out / 'synthetic.png'}, {out / 'planted.png'}; "
          f"per-run results: {out}/<experiment>/<algorithm>/")
    return results


def format_table(summaries: dict[str, dict]) -> str:
    head = (f"{'algorithm':<10} {'acc micro':>9} {'best':>6} {'acc macro':>9} "
            f"{'f1 micro':>8} {'f1 macro':>8} {'ARI':>5} {'s/round':>8}")
    lines = [head, "-" * len(head)]
    for name, s in summaries.items():
        ari = s.get("cluster_ari")
        lines.append(
            f"{name:<10} {s['final_accuracy_micro']:>9.4f} {s['best_accuracy_micro']:>6.4f} "
            f"{s['final_accuracy_macro']:>9.4f} {s['final_f1_micro']:>8.4f} "
            f"{s['final_f1_macro']:>8.4f} {'-' if ari is None else f'{ari:.2f}':>5} "
            f"{s['seconds_per_round']:>8.3f}"
        )
    return "\n".join(lines)
