"""Separates the three settings in which mcfl's FlexCFL (the paper's form, its defaults)
differs from the FlexCFL authors' FedGroup (REPRODUCTION.md, "Against the authors' code"):

* ``l2``: their MCLR's keras ``l2(0.001)`` on the kernel (their mclr.py), run as
  ``--weight-decay 0.002 --weight-decay-on kernels``; the paper's form has no L2.
* ``pretrain``: their cold start pre-trains 50 mini-batch steps from W_0 (their fedgroup.py,
  ``--pretrain-steps 50``); the paper's (Sec. 3.4) one local epoch, after which the client
  goes on for the round's other E - 1 epochs (``--pretrain epoch``, mcfl's default).
* ``evaluation``: their groups test each member with the model it last received (their
  group.py, ``--evaluate-with last_received``); mcfl tests every client with its group's
  current model (``--evaluate-with current``, the default).

Every one of the 2 x 2 x 2 combinations runs on the setting of that comparison (Synthetic(1,1),
100 clients, data seed 2077, MCLR, 20 clients a round, E = 10, B = 10, lr 0.01, K = 5,
151 rounds, evaluated every 5th, the authors' client schedule ``round_robin_first``) for
each training seed, and the script prints a markdown table of best (by FlexCFL's rule) /
final micro accuracy per combination (mean and per seed) and each setting's main effect: the
mean, over the four combinations of the other two settings and over the seeds, of (the
authors' choice) - (the paper's form).

    python benchmarks/flexcfl_differences.py --seeds 2077 2078 2079 2080 2081 2082 \
        --out runs/flexcfl-differences

Each run's result goes to OUT/runs/<combination>_s<seed>.json as it finishes (written
atomically); a rerun skips the runs already there, so a stopped sweep resumes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np

import mcfl
from mcfl.files import atomic

SETTING = dict(dataset="synthetic", synthetic_alpha=1.0, synthetic_beta=1.0, clients=100,
               data_seed=2077, model="mclr", algorithm="flexcfl", clients_per_round=20,
               local_epochs=10, batch_size=10, lr=0.01, clusters=5, eval_every=5,
               score="paper", embed_clients=0, client_sampling="round_robin_first")
# Each setting: (paper's form, authors' choice), as config keys.
FACTORS = {
    "l2": ({}, dict(weight_decay=0.002, weight_decay_on="kernels")),
    "pretrain": ({}, dict(pretrain_steps=50)),
    "evaluation": ({}, dict(evaluate_with="last_received")),
}


def combination_name(choices: tuple[int, ...]) -> str:
    """'paper' for the paper's form, else the authors' settings it takes, joined by '+'."""
    taken = [name for name, choice in zip(FACTORS, choices) if choice]
    return "+".join(taken) or "paper"


def run_one(choices: tuple[int, ...], seed: int, rounds: int) -> dict:
    values = dict(SETTING, rounds=rounds, seed=seed)
    for options, choice in zip(FACTORS.values(), choices):
        values.update(options[choice])
    started = time.perf_counter()
    result = mcfl.run(mcfl.from_dict(values))
    best = result.summary.get("paper_best_accuracy_micro")
    last = result.assignments[-1] if result.assignments is not None else None
    return {"choices": dict(zip(FACTORS, choices)), "seed": seed, "rounds": rounds,
            "best": 100.0 * best, "final": 100.0 * result.summary["final_accuracy_micro"],
            "group_sizes": None if last is None else sorted(
                np.bincount(last, minlength=SETTING["clusters"]).tolist(), reverse=True),
            "seconds": time.perf_counter() - started}


def table(records: list[dict], seeds: list[int]) -> str:
    lines = ["| combination (authors' settings taken) | best, mean | final, mean | "
             + " | ".join(f"seed {s} best / final" for s in seeds) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in seeds) + " |"]
    by_key = {(combination_name(tuple(r["choices"].values())), r["seed"]): r for r in records}
    for choices in itertools.product((0, 1), repeat=len(FACTORS)):
        name = combination_name(choices)
        runs = [by_key.get((name, s)) for s in seeds]
        done = [r for r in runs if r is not None]
        if not done:
            continue
        cells = [f"{r['best']:.1f} / {r['final']:.1f}" if r else "-" for r in runs]
        lines.append(f"| {name} | {np.mean([r['best'] for r in done]):.1f} | "
                     f"{np.mean([r['final'] for r in done]):.1f} | " + " | ".join(cells) + " |")
    lines += ["", "| setting | main effect on best (authors' - paper's) | on final |",
              "| --- | --- | --- |"]
    for index, name in enumerate(FACTORS):
        effects = {"best": [], "final": []}
        for r in records:
            choices = tuple(r["choices"].values())
            if choices[index]:
                flipped = choices[:index] + (0,) + choices[index + 1:]
                partner = by_key.get((combination_name(flipped), r["seed"]))
                if partner is not None:
                    for score in effects:
                        effects[score].append(r[score] - partner[score])
        if effects["best"]:
            lines.append(f"| {name} | {np.mean(effects['best']):+.1f} "
                         f"(+/- {np.std(effects['best']):.1f}, {len(effects['best'])} pairs) | "
                         f"{np.mean(effects['final']):+.1f} "
                         f"(+/- {np.std(effects['final']):.1f}) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[2077, 2078])
    parser.add_argument("--rounds", type=int, default=151)
    parser.add_argument("--out", type=Path, default=Path("runs/flexcfl-differences"))
    args = parser.parse_args()
    folder = args.out / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for seed in args.seeds:
        for choices in itertools.product((0, 1), repeat=len(FACTORS)):
            path = folder / f"{combination_name(choices)}_s{seed}.json"
            if path.is_file():
                record = json.loads(path.read_text())
            else:
                record = run_one(choices, seed, args.rounds)
                atomic.write_text(path, json.dumps(record, indent=1))
            if record["rounds"] != args.rounds:
                raise SystemExit(f"{path} holds a run of {record['rounds']} rounds, not "
                                 f"{args.rounds}: give another --out")
            records.append(record)
            print(f"{combination_name(choices)} seed {seed}: best {record['best']:.1f} final "
                  f"{record['final']:.1f} groups {record['group_sizes']} "
                  f"({record['seconds']:.0f} s)", flush=True)
    text = table(records, args.seeds)
    atomic.write_text(args.out / "table.md", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
