"""The FlexCFL authors' own code (FedAvg, IFCA, FeSEM, FedGroup) beside mcfl's fedavg, ifca,
fesem and flexcfl on one dataset that mcfl exports: best and final accuracy per algorithm and
seed, and the curves.

    .venv/bin/python benchmarks/peers/flexcfl_authors.py --checkout /tmp/flexcfl_checkout \\
        --their-python /work/tfenv/bin/python --out runs/flexcfl-authors --seeds 2077 2078
    .venv/bin/python benchmarks/peers/flexcfl_authors.py --checkout DIR --their-python PY \\
        --out DIR --rounds 6 --algorithms fedavg fedgroup          # smoke test (minutes)

Their code: github.com/morningD/FlexCFL (TensorFlow 2; checked against commit 968b5fa, "Update
README.md"), the reference code of Duan et al., "Flexible Clustered Federated Learning for
Client-Level Data Distribution Shift" (TPDS 2022). Nothing of that repository is copied into
this project: the user clones it and passes the folder as ``--checkout``. For each of their
runs the harness copies that folder (without its ``data/`` and ``results/``) into a temporary
folder, applies the compatibility edits below to the copy, links the export in as their
``data/synthetic_1_1/data/{train,test}`` and runs, in a subprocess with ``--their-python`` (a
Python with TensorFlow, tf_keras, scikit-learn, scipy, pandas, openpyxl and termcolor; the
environment has ``TF_USE_LEGACY_KERAS=1``, so ``tf.keras`` is tf_keras, the Keras 2 their code
was written for), the calls their ``main.py`` and ``test.ipynb`` make: ``TrainConfig(dataset,
"mclr", trainer)`` from ``utils/trainer_utils.py``, a few of its entries set (below), then
``FedAvg(config).train()`` (``flearn/trainer/fedavg.py``), ``IFCA`` (``ifca.py``), ``FeSEM``
(``fesem.py``) or ``FedGroup`` (``fedgroup.py``). Everything else (the data reader
``utils/read_data.py``, their MCLR ``flearn/model/synthetic/mclr.py``, ``Client``, ``Group``,
``Server``, their result writer) is theirs, unmodified but for the edits. The only hook: the
subprocess wraps their ``ResultWriter.write_row`` (``utils/export_result.py``) to also keep each
evaluated round's row, the groups' sizes and the time, and writes them as JSON for the harness;
their own ``.xlsx`` is still written, in the temporary copy (``--keep-copy`` keeps it; under
pandas 3 its "max accuracy" row stays empty, as their chained assignment
``df.loc[...][col] = ...`` no longer writes through: only that spreadsheet row is affected).

Compatibility edits, applied to the copy as exact text substitutions (each must match as many
times as listed, else the harness stops and names the file: their code has changed):

* ``flearn/client.py``: ``self.model.layers[-1].output_shape[-1]`` -> ``.units`` (1 place):
  tf_keras 2.21 layers no longer have ``output_shape``; their last layer is always a ``Dense``,
  whose ``units`` is the same number (the classes).
* ``np.float`` -> ``float`` (6 places: ``flearn/trainer/fedavg.py`` 1,
  ``flearn/trainer/groupbase.py`` 1, ``flearn/group.py`` 4): NumPy 1.24 removed the alias; it
  was Python's ``float``.
* ``flearn/trainer/fedgroup.py``: ``KMeans(..., max_iter=max_iter)`` gets ``n_init=10`` (1
  place): scikit-learn 1.4 changed KMeans' default ``n_init`` from 10 to "auto" (1 run with
  k-means++); 10 is what their code ran with.

Data: ``mcfl data export --format leaf`` writes Synthetic(alpha, beta) (default (1,1)) with
``--clients`` (100) and data seed ``--data-seed`` (2077): each client's train and test rows
exactly as mcfl trains on them (mcfl/data/export.py). Their reader takes the same JSON; mcfl's
runs read the export back (``mcfl run --dataset leaf --data-dir EXPORT``), so both codes train
and test on the same rows. Their code sorts clients by id; the export's ids sort in mcfl's
order.

Settings (both codes): MCLR 60 -> 10 (their ``mclr.py``: a softmax ``Dense`` with keras
``l2(0.001)`` on the kernel, Glorot-uniform kernel, zero bias; mcfl: ``--model mclr``,
LeCun-normal kernel, zero bias), ``--clients-per-round`` 20, E = ``--epochs`` 10, B =
``--batch`` 10, plain SGD lr ``--lr`` 0.01, K = ``--groups`` 5, evaluated every
``--eval-every`` 5 rounds, ``--rounds`` (151), seed ``--seeds``; their defaults otherwise
(their FedGroup's alpha 20, so 100 clients pre-train 50 steps each from the initial model,
fedgroup.py lines 25 and 82; its EDC measure). Their ``TrainConfig`` entries the harness sets:
``num_rounds``, ``eval_every``, ``clients_per_round``, ``seed``, ``dynamic = False`` (no client
migration: FedGroup rather than FlexCFL, as the paper's static table; their IFCA and FeSEM
default to it already), ``num_group``, and the client's ``local_epochs``, ``batch_size``,
``learning_rate``.

Three columns (``--codes``):

* ``authors``: their code, as above.
* ``mcfl-authors``: mcfl set to their code where mcfl has the setting: ``--weight-decay 0.002
  --weight-decay-on kernels`` (their MCLR's keras ``l2(0.001)`` on the kernel adds 0.002 W to
  the kernel's gradient) for every algorithm; IFCA, FeSEM and FlexCFL: ``--evaluate-with
  last_received`` (their groups test each member with the model it last received, group.py
  lines 149-151 and 211); FlexCFL: ``--pretrain-steps 50`` (their pre-training); FeSEM:
  ``--fesem-lambda 0`` (their FeSEM trains without the proximal term).
* ``mcfl-paper``: mcfl's defaults (the papers' algorithms; FlexCFL's one-epoch pre-training,
  each client tested with its group's current model).

Both mcfl columns schedule the grouped algorithms (IFCA, FeSEM, FlexCFL) with
``--client-sampling round_robin_first``, as their GroupBase does (the first C / 20 rounds go
through every client once, then random); FedAvg samples at random in both codes.

What is left different, on purpose (the differences the comparison is meant to show): their
IFCA and FeSEM set a group's new model from its first sampled member's update only
(group.py, ``aggregation_strategy == 'avg'`` passes one weight, and ``zip`` stops at the first
update); mcfl averages the members. Their IFCA and FeSEM start from K freshly initialised
models; mcfl's IFCA from K random models, its FeSEM from k-means on one round of local models.
Their FeSEM assigns a client by the distance of its previous local solution before training;
mcfl's after training.

Scores: accuracy is micro ("weighted") accuracy over all clients' test rows, in percent.
Their rounds are numbered from 0 and evaluated when ``round % eval_every == 0`` (their group
trainers also test the last round only when ``(rounds - 1) % eval_every == 0``, since their
test for it compares with ``num_rounds``: hence 151); here a round is the number of rounds
trained, so theirs are evaluated after rounds 1, 6, 11, ..., 151 and mcfl's after 5, 10, ...,
150, 151. "Best" follows FlexCFL's rule: the best evaluated round at which every client is in
a group (their writer leaves rounds before the round robin has visited everyone empty; mcfl's
``paper_best_accuracy_micro``); FedAvg's best is over all its evaluated rounds. "Final" is the
last evaluated round.

Output (``--out DIR``): ``export/`` (the dataset), ``runs/CODE_ALGORITHM_sSEED.json`` (each
run's record: settings, curve, best, final, seconds, versions, edits), ``logs/`` (each run's
output), ``mcfl/`` (mcfl's run folders), and, rebuilt from every record in ``runs/`` after
each run: ``table.md``, ``table.json``, ``curves.csv``, ``curves.png``. Every file is written
whole (mcfl.files.atomic). A run whose record already exists with the same settings is not run again
(``--rerun`` forces it), so a comparison can be run in parts (``--algorithms``, ``--codes``,
``--seeds``) into one folder. Their TensorFlow uses ``--their-threads`` threads (1 by default:
steadier on a shared 2-core machine); mcfl runs with JAX's defaults.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the mcfl repository
CODES = ("authors", "mcfl-authors", "mcfl-paper")
CODE_TITLES = {"authors": "authors' code", "mcfl-authors": "mcfl, authors' settings",
               "mcfl-paper": "mcfl, paper's form"}
ALGORITHMS = ("fedavg", "ifca", "fesem", "fedgroup")
TITLES = {"fedavg": "FedAvg", "ifca": "IFCA", "fesem": "FeSEM", "fedgroup": "FedGroup / FlexCFL"}
MCFL_ALGORITHM = {"fedavg": "fedavg", "ifca": "ifca", "fesem": "fesem", "fedgroup": "flexcfl"}
THEIR_TRAINER = {"fedavg": ("flearn.trainer.fedavg", "FedAvg"),
                 "ifca": ("flearn.trainer.ifca", "IFCA"),
                 "fesem": ("flearn.trainer.fesem", "FeSEM"),
                 "fedgroup": ("flearn.trainer.fedgroup", "FedGroup")}
DATASET = "synthetic_1_1"  # their name: read from data/NAME/data, model flearn/model/synthetic
# (file, old, new, times): the compatibility edits (module docstring)
EDITS = [
    ("flearn/client.py", "self.model.layers[-1].output_shape[-1]",
     "self.model.layers[-1].units", 1),
    ("flearn/trainer/fedavg.py", "np.float)", "float)", 1),
    ("flearn/trainer/groupbase.py", "np.float)", "float)", 1),
    ("flearn/group.py", "np.float)", "float)", 4),
    ("flearn/trainer/fedgroup.py",
     "KMeans(n_clusters, random_state=self.seed, max_iter=max_iter)",
     "KMeans(n_clusters, random_state=self.seed, max_iter=max_iter, n_init=10)", 1),
]


# --------------------------------------------------------------------------------------------
# Their side: runs in a subprocess with --their-python (TensorFlow), stdlib and their code only.

def their_run(spec_file: str) -> None:
    """One run of their code (in the patched copy `spec["copy"]`); writes spec["result"]."""
    spec = json.loads(Path(spec_file).read_text())
    copy = spec["copy"]
    os.chdir(copy)  # their ResultWriter writes results/NAME/ under the working folder
    sys.path.insert(0, copy)
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(spec["threads"])
    tf.config.threading.set_inter_op_parallelism_threads(spec["threads"])
    from utils.export_result import ResultWriter
    from utils.trainer_utils import TrainConfig

    module, name = THEIR_TRAINER[spec["algorithm"]]
    trainer_class = getattr(importlib.import_module(module), name)
    config = TrainConfig(DATASET, "mclr", spec["algorithm"])
    config.trainer_config.update(num_rounds=spec["rounds"], eval_every=spec["eval_every"],
                                 clients_per_round=spec["clients_per_round"],
                                 seed=spec["seed"], dynamic=False)
    if spec["algorithm"] != "fedavg":
        config.trainer_config["num_group"] = spec["groups"]
    config.client_config.update(local_epochs=spec["epochs"], batch_size=spec["batch"],
                                learning_rate=spec["lr"])

    evaluations, held = [], {}
    original = ResultWriter.write_row

    def write_row(self, comm_round, result):  # the harness's hook: keep the row, then theirs
        accuracy = result[0]
        trainer = held.get("trainer")
        groups = getattr(trainer, "groups", None)
        evaluations.append({
            "round": int(comm_round) + 1,  # rounds trained
            "accuracy": None if accuracy is None or not np.isfinite(accuracy)
            else 100.0 * float(accuracy),
            "seconds": time.perf_counter() - held["train_start"],
            "group_sizes": [len(g.downlink) for g in groups] if groups else None})
        return original(self, comm_round, result)

    ResultWriter.write_row = write_row
    start = time.perf_counter()
    trainer = trainer_class(config)  # reads the data, builds the model (FedGroup: cold start)
    held.update(trainer=trainer, train_start=time.perf_counter())
    setup_seconds = held["train_start"] - start
    trainer.train()
    train_seconds = time.perf_counter() - held["train_start"]
    held.clear()
    del trainer  # their ResultWriter.__del__ writes its .xlsx now, not at interpreter exit
    versions = {"tensorflow": tf.__version__, "numpy": np.__version__}
    for package in ("tf_keras", "sklearn", "pandas", "scipy"):
        try:
            versions[package] = importlib.import_module(package).__version__
        except ImportError:
            versions[package] = None
    out = {"evaluations": evaluations, "setup_seconds": setup_seconds,
           "train_seconds": train_seconds, "versions": versions,
           "trainer_config": {k: v for k, v in config.trainer_config.items()
                              if isinstance(v, (int, float, str, bool, type(None)))},
           "client_config": dict(config.client_config)}
    partial = Path(spec["result"] + ".partial")
    partial.write_text(json.dumps(out, indent=1))
    partial.replace(spec["result"])


# --------------------------------------------------------------------------------------------
# The harness: runs in mcfl's environment.

def patched_copy(checkout: Path, export: Path, into: Path) -> list[str]:
    """Copy `checkout` into `into`, apply EDITS, link the export in as their data; returns the
    edits applied, one line each."""
    shutil.copytree(checkout, into, symlinks=True,
                    ignore=shutil.ignore_patterns(".git", "data", "results", "__pycache__"))
    applied = []
    for file, old, new, times in EDITS:
        path = into / file
        text = path.read_text() if path.is_file() else ""
        found = text.count(old)
        if found != times:
            sys.exit(f"--checkout {checkout}: {file} holds {old!r} {found} times, not {times}: "
                     "not the FlexCFL code this harness was written for (commit 968b5fa)")
        path.write_text(text.replace(old, new))
        applied.append(f"{file}: {old} -> {new} ({times}x)")
    data = into / "data" / DATASET / "data"
    data.mkdir(parents=True)
    for split in ("train", "test"):
        (data / split).symlink_to((export / split).resolve(), target_is_directory=True)
    return applied


def checkout_commit(checkout: Path) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True)
        return done.stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def mcfl_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_logged(command: list[str], log: Path, env: dict, cwd: Path | None = None) -> float:
    """Run `command` with its output to `log`; returns its seconds; exits on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "w") as f:
        f.write("$ " + " ".join(command) + "\n")
        f.flush()
        done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    seconds = time.perf_counter() - start
    if done.returncode:
        tail = log.read_text().splitlines()[-15:]
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}\n  log {log}:\n    "
                 + "\n    ".join(tail))
    return seconds


def export_data(args, export: Path) -> list[str]:
    command = [sys.executable, "-m", "mcfl", "data", "export", "--dataset", "synthetic",
               "--synthetic-alpha", f"{args.alpha:g}", "--synthetic-beta", f"{args.beta:g}",
               "--clients", str(args.clients), "--data-seed", str(args.data_seed),
               "--format", "leaf", "--out", str(export)]
    manifest = export / "mcfl_export.json"
    if manifest.is_file():
        held = json.loads(manifest.read_text()).get("settings", {})
        wanted = {"dataset": "synthetic", "synthetic_alpha": args.alpha,
                  "synthetic_beta": args.beta, "clients": args.clients,
                  "data_seed": args.data_seed}
        if all(held.get(k) == v for k, v in wanted.items()):
            print(f"export: kept {export}", flush=True)
            return command
        sys.exit(f"{export} holds another export ({manifest}); give another --out")
    seconds = run_logged(command, export.parent / "logs" / "export.log", mcfl_env())
    print(f"export: {export} ({seconds:.0f} s)", flush=True)
    return command


def settings_of(args) -> dict:
    return {"rounds": args.rounds, "eval_every": args.eval_every,
            "clients_per_round": args.clients_per_round, "epochs": args.epochs,
            "batch": args.batch, "lr": args.lr, "groups": args.groups,
            "data": {"dataset": f"synthetic({args.alpha:g},{args.beta:g})",
                     "clients": args.clients, "data_seed": args.data_seed}}


def run_authors(args, algorithm: str, seed: int, export: Path, out: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="flexcfl-authors-") as tmp:
        copy = Path(tmp) / "FlexCFL"
        edits = patched_copy(args.checkout, export, copy)
        spec = {"copy": str(copy), "algorithm": algorithm, "seed": seed,
                "rounds": args.rounds, "eval_every": args.eval_every,
                "clients_per_round": args.clients_per_round, "epochs": args.epochs,
                "batch": args.batch, "lr": args.lr, "groups": args.groups,
                "threads": args.their_threads, "result": str(Path(tmp) / "result.json")}
        (Path(tmp) / "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
                   CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", ""))
        command = [str(args.their_python), str(Path(__file__).resolve()), "--their-run",
                   str(Path(tmp) / "spec.json")]
        seconds = run_logged(command, out / "logs" / f"authors_{algorithm}_s{seed}.log", env)
        result = json.loads((Path(tmp) / "result.json").read_text())
        if args.keep_copy:
            kept = out / "copies" / f"{algorithm}_s{seed}"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(copy, kept, symlinks=True)
    curve = [(e["round"], e["accuracy"]) for e in result["evaluations"]]
    scored = [a for _, a in curve if a is not None]
    last = result["evaluations"][-1] if result["evaluations"] else {}
    return {"curve": curve, "best": max(scored) if scored else None,
            "final": scored[-1] if scored else None,
            "final_round": max((r for r, a in curve if a is not None), default=None),
            "group_sizes": last.get("group_sizes"), "seconds": seconds,
            "setup_seconds": result["setup_seconds"], "train_seconds": result["train_seconds"],
            "seconds_per_round": result["train_seconds"] / args.rounds,
            "versions": result["versions"], "edits": edits,
            "their_config": {"trainer": result["trainer_config"],
                             "client": result["client_config"]},
            "checkout_commit": checkout_commit(args.checkout),
            "threads": args.their_threads, "command": "python main.py equivalent: "
            f"TrainConfig('{DATASET}', 'mclr', '{algorithm}') -> "
            f"{THEIR_TRAINER[algorithm][1]}(config).train()"}


def mcfl_flags(code: str, algorithm: str) -> list[str]:
    """mcfl's flags beyond the shared settings for `code` (module docstring)."""
    flags = []
    if algorithm != "fedavg":
        flags += ["--client-sampling", "round_robin_first"]
    if code == "mcfl-authors":
        flags += ["--weight-decay", "0.002", "--weight-decay-on", "kernels"]
        if algorithm != "fedavg":
            flags += ["--evaluate-with", "last_received"]
        if algorithm == "fedgroup":
            flags += ["--pretrain-steps", "50"]
        if algorithm == "fesem":
            flags += ["--fesem-lambda", "0"]
    return flags


def run_mcfl(args, code: str, algorithm: str, seed: int, export: Path, out: Path) -> dict:
    folder = out / "mcfl" / f"{code}_{algorithm}_s{seed}"
    command = [sys.executable, "-m", "mcfl", "run", "--dataset", "leaf", "--data-dir",
               str(export), "--algorithm", MCFL_ALGORITHM[algorithm], "--model", "mclr",
               "--rounds", str(args.rounds), "--clients-per-round", str(args.clients_per_round),
               "--local-epochs", str(args.epochs), "--batch-size", str(args.batch),
               "--lr", f"{args.lr:g}", "--clusters", str(args.groups),
               "--eval-every", str(args.eval_every), "--seed", str(seed), "--score", "paper",
               "--embed-clients", "0", *mcfl_flags(code, algorithm),
               "--out", str(folder), "--overwrite"]
    seconds = run_logged(command, out / "logs" / f"{code}_{algorithm}_s{seed}.log", mcfl_env())
    summary = json.loads((folder / "summary.json").read_text())
    import csv

    with open(folder / "rounds.csv") as f:
        rows = list(csv.DictReader(f))
    curve = [(int(r["round"]), 100.0 * float(r["accuracy_micro"])) for r in rows
             if r.get("accuracy_micro") not in (None, "")]
    best = summary.get("paper_best_accuracy_micro")
    if best is None:
        best = summary.get("best_accuracy_micro")
    final = summary.get("final_accuracy_micro")
    sizes = None
    assignments = folder / "assignments.npz"
    if assignments.is_file() and algorithm != "fedavg":
        import numpy as np

        with np.load(assignments) as held:
            last = np.asarray(held["assignments"])[-1]  # [C] clusters after the last round
        sizes = [int((last == k).sum()) for k in range(args.groups)]
    return {"curve": curve, "best": None if best is None else 100.0 * best,
            "final": None if final is None else 100.0 * final,
            "final_round": curve[-1][0] if curve else None, "group_sizes": sizes,
            "seconds": seconds, "wall_seconds": summary.get("wall_seconds"),
            "seconds_per_round": summary.get("seconds_per_round"),
            "versions": {"jax": summary.get("jax_version")},
            "command": " ".join(["mcfl", *command[3:]])}


def fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def write_outputs(out: Path, records: list[dict], export_command: list[str]) -> None:
    from mcfl.files import atomic

    codes = [c for c in CODES if any(r["code"] == c for r in records)]
    algorithms = [a for a in ALGORITHMS if any(r["algorithm"] == a for r in records)]
    seeds = sorted({r["seed"] for r in records})
    by_key = {(r["code"], r["algorithm"], r["seed"]): r for r in records}
    settings = sorted({json.dumps(r["settings"], sort_keys=True) for r in records})

    lines = ["| algorithm | seed | " + " | ".join(f"{CODE_TITLES[c]} best / final"
                                                for c in codes) + " |",
             "| --- | --- | " + " | ".join("---" for _ in codes) + " |"]
    table = []
    for algorithm in algorithms:
        for seed in seeds + (["mean"] if len(seeds) > 1 else []):
            cells, entry = [], {"algorithm": algorithm, "seed": seed}
            for code in codes:
                if seed == "mean":
                    held = [by_key[(code, algorithm, s)] for s in seeds
                            if (code, algorithm, s) in by_key]
                    best = mean([r["best"] for r in held]) if len(held) == len(seeds) else None
                    final = mean([r["final"] for r in held]) if len(held) == len(seeds) else None
                else:
                    r = by_key.get((code, algorithm, seed))
                    best, final = (r["best"], r["final"]) if r else (None, None)
                cells.append(f"{fmt(best)} / {fmt(final)}")
                entry[code] = {"best": best, "final": final}
            seed_cell = f"**{seed}**" if seed == "mean" else str(seed)
            lines.append(f"| {TITLES[algorithm]} | {seed_cell} | " + " | ".join(cells) + " |")
            table.append(entry)
    lines += ["", "Seconds of each whole run (s per round in brackets: theirs the training "
              "loop's mean, evaluations included; mcfl's the steady mean, compilation "
              "excluded) and the group sizes after the last round, largest first:", "",
              "| algorithm | seed | " + " | ".join(CODE_TITLES[c] for c in codes) + " |",
        "| --- | --- | " + " | ".join("---" for _ in codes) + " |"]
    for algorithm in algorithms:
        for seed in seeds:
            cells = []
            for code in codes:
                r = by_key.get((code, algorithm, seed))
                if r is None:
                    cells.append("-")
                    continue
                sizes = "/".join(map(str, sorted(r["group_sizes"], reverse=True))) \
                    if r.get("group_sizes") else ""
                per_round = r.get("seconds_per_round")
                cells.append(f"{r['seconds']:.0f} ({fmt(per_round, 2)})"
                             + (f"; {sizes}" if sizes else ""))
            lines.append(f"| {TITLES[algorithm]} | {seed} | " + " | ".join(cells) + " |")
    head = ["Micro test accuracy in percent over all clients' test rows; best by FlexCFL's "
            "rule (every client in a group), final = last evaluated round. Settings: "
            + "; ".join(settings) + ".", f"Data: `{' '.join(['mcfl', *export_command[3:]])}`.",
            ""]
    atomic.write_text(out / "table.md", "\n".join(head + lines) + "\n")
    atomic.write_json(out / "table.json", {"table": table, "runs": records})

    curve_rows = [{"code": r["code"], "algorithm": r["algorithm"], "seed": r["seed"],
                   "round": rnd, "accuracy": acc}
                  for r in records for rnd, acc in r["curve"]]
    atomic.write_csv(out / "curves.csv", curve_rows,
                     columns=["code", "algorithm", "seed", "round", "accuracy"])

    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(algorithms), figsize=(4.2 * len(algorithms), 3.6),
                             squeeze=False)
    colors = {"authors": "tab:red", "mcfl-authors": "tab:blue", "mcfl-paper": "tab:green"}
    styles = ["-", "--", ":", "-."]
    for ax, algorithm in zip(axes[0], algorithms):
        for code in codes:
            for i, seed in enumerate(seeds):
                r = by_key.get((code, algorithm, seed))
                if r is None:
                    continue
                points = [(x, y) for x, y in r["curve"] if y is not None]
                ax.plot([x for x, _ in points], [y for _, y in points],
                        color=colors[code], linestyle=styles[i % len(styles)], marker="o",
                        markersize=2,
                        label=f"{CODE_TITLES[code]}, seed {seed}")
        ax.set_title(TITLES[algorithm])
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    atomic.replace_file(out / "curves.png", lambda f: f.write(buffer.getvalue()))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--their-run":
        their_run(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, required=True,
                        help="a clone of github.com/morningD/FlexCFL (never modified)")
    parser.add_argument("--their-python", type=Path, default=Path(sys.executable),
                        help="a Python with tensorflow, tf_keras, scikit-learn, scipy, pandas, "
                        "openpyxl, termcolor (default: this one)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument("--codes", nargs="+", choices=CODES, default=list(CODES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[2077])
    parser.add_argument("--rounds", type=int, default=151,
                        help="151: their group trainers also test the last round")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--clients-per-round", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--groups", type=int, default=5, help="K")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--data-seed", type=int, default=2077)
    parser.add_argument("--alpha", type=float, default=1.0, help="Synthetic(alpha, beta)")
    parser.add_argument("--beta", type=float, default=1.0, help="Synthetic(alpha, beta)")
    parser.add_argument("--their-threads", type=int, default=1, help="TensorFlow's threads")
    parser.add_argument("--rerun", action="store_true",
                        help="run again the runs whose records exist with these settings")
    parser.add_argument("--keep-copy", action="store_true",
                        help="keep each patched copy of their code (with its .xlsx) in "
                        "OUT/copies")
    args = parser.parse_args()
    args.checkout = args.checkout.resolve()
    if "authors" in args.codes and not (args.checkout / "flearn" / "trainer" /
                                        "fedgroup.py").is_file():
        sys.exit(f"--checkout {args.checkout}: no flearn/trainer/fedgroup.py there (clone "
                 "github.com/morningD/FlexCFL and pass its folder)")
    sys.path.insert(0, str(ROOT))
    from mcfl.files import atomic

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    export = out / "export"
    export_command = export_data(args, export)
    settings = settings_of(args)
    runs = out / "runs"
    for algorithm in args.algorithms:
        for seed in args.seeds:
            for code in args.codes:
                path = runs / f"{code}_{algorithm}_s{seed}.json"
                if path.is_file() and not args.rerun:
                    if json.loads(path.read_text()).get("settings") == settings:
                        print(f"{code} {algorithm} seed {seed}: kept {path}", flush=True)
                        continue
                    sys.exit(f"{path} was run with other settings; --rerun or another --out")
                print(f"{code} {algorithm} seed {seed}: running ...", flush=True)
                if code == "authors":
                    record = run_authors(args, algorithm, seed, export, out)
                else:
                    record = run_mcfl(args, code, algorithm, seed, export, out)
                record.update(code=code, algorithm=algorithm, seed=seed, settings=settings)
                atomic.write_json(path, record)
                print(f"{code} {algorithm} seed {seed}: best {fmt(record['best'])}, final "
                      f"{fmt(record['final'])} (round {record['final_round']}), "
                      f"{record['seconds']:.0f} s", flush=True)
                write_all(out, settings, export_command)
    if write_all(out, settings, export_command):
        print((out / "table.md").read_text(), end="")


def write_all(out: Path, settings: dict, export_command: list[str]) -> bool:
    """Rebuild the table and curves from every record in OUT/runs with these settings."""
    records = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    matching = [r for r in records if r.get("settings") == settings]
    if len(matching) < len(records):
        print(f"({len(records) - len(matching)} records in {out / 'runs'} have other settings; "
              "left out of the table)", flush=True)
    if matching:
        write_outputs(out, matching, export_command)
    return bool(matching)


if __name__ == "__main__":
    main()
