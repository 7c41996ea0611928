"""Each clustered algorithm's defaults against its paper's setting, on planted data that no
test or table of mcfl tunes on (REPRODUCTION.md, "Defaults against each paper's setting").

    python experiments/defaults_audit.py OUT [--seeds 3] [--algorithms robust,cfl] [--shifts x]

The data: Fashion-MNIST, 240 clients of 100 training images, 4 planted groups of uneven sizes
(96, 72, 48, 24 clients: shares 4, 3, 2, 1) with Dirichlet(0.5) label skew inside each, under
one of three shifts (``SHIFTS``): P(X) (turned by 0 / 90 / 180 / 270 degrees), P(X|Y) (a pool
of 5 classes turned by each group's own right angle) or P(Y|X) (labels swapped in pairs per
group); MCLR, SGD lr 0.05, E = 5 local epochs of B = 10, 20 of the 240 clients a round (mcfl's
default), 30 rounds, K = 4. Every algorithm runs with its registered defaults and, where its
paper's setting is a choice among others (``VARIANTS``), with each value of that choice, as one
sweep over the seeds. Each sweep is a folder of OUT (a finished one is read back, a stopped one
resumed: stopping loses nothing finished); the table goes to OUT/table.md and OUT/table.json,
each written atomically.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import mcfl
from mcfl.algorithms.framework.registry import REGISTRY
from mcfl.files.atomic import replace_file

SHIFTS = {"x": "rotated:4/4,3,2,1+dirichlet:0.5",
          "x_given_y": "shift_x_given_y:4/4,3,2,1@0.5+dirichlet:0.5",
          "y_given_x": "label_swap:4/4,3,2,1+dirichlet:0.5"}
COMMON = dict(dataset="fmnist", clients=240, samples_per_client=125, test_fraction=0.2,
              model="mclr", lr=0.05, local_epochs=5, batch_size=10, rounds=30, clusters=4,
              eval_every=5)
# the algorithm's choices its paper settles (the first value is mcfl's default): a grid of
# one key each, so that every value runs beside the default on the same data
VARIANTS = {
    "robust": {"robust_start_epochs": [20, 0]},
    "ifca": {"ifca_init": ["random", "kmeans++"]},
    "cfl": {"cfl_thresholds": ["relative", "absolute"]},
    "stocfl": {"stocfl_tau": [0.65, 0.3]},
    "flhc": {"flhc_warmup": [10, 3]},
    "cflgp": {"cflgp_protocol": ["gradient", "model_averaging"]},
    "fesem": {"fesem_last_layer": [False, True]},
    "fedsoft": {"fedsoft_evaluate": ["local", "center"]},
    "fedgwc": {"fedgwc_eps": [1e-5, 1e-4, 1e-3]},
}
# values a variant needs beside its grid (CFL's absolute thresholds are the paper code's)
PAIRED = {("cfl_thresholds", "absolute"): dict(cfl_eps1=0.4, cfl_eps2=1.6)}


def clustered_algorithms() -> list[str]:
    return [name for name, spec in REGISTRY.items()
            if spec.clustered and not spec.asynchronous and name != "dp_fesem"]


def sweep_of(out: Path, shift: str, algorithm: str, key: str | None, value, seeds: int):
    config = mcfl.RunConfig(**COMMON, partition=SHIFTS[shift], algorithm=algorithm,
                            **({key: value} if key else {}),
                            **PAIRED.get((key, value), {}))
    folder = out / shift / (algorithm if key is None else f"{algorithm}-{key}-{value}")
    if (folder / "sweep.json").is_file():  # finished: read back; stopped: resumed
        return mcfl.sweep(resume=folder).summary[0]
    return mcfl.sweep(config, seeds=seeds, out_dir=folder).summary[0]


def shown(row: dict, key: str) -> str:
    mean, std = row.get(f"{key}_mean"), row.get(f"{key}_std")
    if mean is None:
        return "-"
    return f"{100 * mean:.1f} ± {100 * (std or 0):.1f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--algorithms", default=",".join(clustered_algorithms()))
    parser.add_argument("--shifts", default=",".join(SHIFTS))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results, lines = [], [
        "| shift | algorithm | setting | final ARI | final accuracy | final worst group |",
        "| --- | --- | --- | --- | --- | --- |"]
    for shift in args.shifts.split(","):
        for algorithm in args.algorithms.split(","):
            grid = VARIANTS.get(algorithm, {None: [None]})
            for key, values in grid.items():
                for value in values:
                    row = sweep_of(out, shift, algorithm, key, value, args.seeds)
                    setting = "defaults" if key is None else f"{key} = {value}" + (
                        " (default)" if value == values[0] else "")
                    results.append({"shift": shift, "algorithm": algorithm, "setting": setting,
                                    **{k: v for k, v in row.items()
                                       if isinstance(v, (int, float, str, type(None)))}})
                    lines.append(f"| {shift} | {algorithm} | {setting} | "
                                 f"{shown(row, 'cluster_ari')} | "
                                 f"{shown(row, 'final_accuracy_micro')} | "
                                 f"{shown(row, 'worst_group_accuracy')} |")
                    print(lines[-1], flush=True)
    replace_file(out / "table.json", lambda f: f.write(json.dumps(results, indent=1).encode()))
    replace_file(out / "table.md", lambda f: f.write(("\n".join(lines) + "\n").encode()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
