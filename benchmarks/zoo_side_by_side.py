"""One FedAvg round of a zoo model, mcfl next to a PyTorch per-client loop, in one run.

    .venv/bin/python benchmarks/zoo_side_by_side.py --model cnn-cifar --rounds 4
    .venv/bin/python benchmarks/zoo_side_by_side.py --model resnet18-gn --out runs/zoo-resnet
    .venv/bin/python benchmarks/zoo_side_by_side.py --model char-lstm --quick   # smoke test

The workload (`peers/zoo_workload.py`): 20 clients a round, each 5 SGD steps of B = 10 (lr
0.01) from the global model, then the plain mean; random data of CIFAR-10's or LEAF
Shakespeare's shapes. `--model`: ``cnn-cifar`` (FedAvg's CIFAR CNN, 1.76 M parameters),
``resnet18-gn`` (11.2 M) or ``char-lstm`` (LEAF's Shakespeare LSTM, 818 k).

Contenders, one after another, each in its own process (so none shares threads, caches or
memory with another): mcfl's FedAvg (`peers/mcfl_zoo_round.py`: conv and low-rank "auto"; for
the CNNs also flax's nn.Conv, `--conv xla`; for cnn-cifar also its dense kernel without the
factored path, `--low-rank off`) and the PyTorch loop (`peers/torch_zoo_round.py`, from
`--torch-python`: this Python when it has torch, else /work/peers-venv; skipped with a note when
neither has it). Each first passes `--check` (one round of 2 clients: finite parameters that
moved, and the model's trainable parameter count, the same on both sides), then is timed.
Prints a Markdown table of seconds per round and writes OUT/zoo_side_by_side.json. `--quick` passes
`--quick` on (2 clients, 2 rounds, a narrow ResNet / LSTM): a check that everything runs, not
a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from fedavg_side_by_side import PEERS, run_json

MODELS = ("cnn-cifar", "resnet18-gn", "char-lstm")
PEERS_PYTHON = "/work/peers-venv/bin/python"


def has_torch(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "import torch"], capture_output=True,
                              timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def default_torch_python() -> str | None:
    for python in (sys.executable, PEERS_PYTHON):
        if Path(python).exists() and has_torch(python):
            return python
    return None


def contenders(model: str, torch_python: str | None) -> list[tuple[str, list[str]]]:
    """(key, command) of each contender (see the module docstring)."""
    mcfl = [sys.executable, str(PEERS / "mcfl_zoo_round.py"), "--model", model]
    out = [("mcfl", mcfl)]
    if model != "char-lstm":
        out.append(("mcfl-xla", mcfl + ["--conv", "xla"]))
    if model == "cnn-cifar":
        out.append(("mcfl-dense", mcfl + ["--low-rank", "off"]))
    if torch_python:
        out.append(("torch", [torch_python, str(PEERS / "torch_zoo_round.py"), "--model", model]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=MODELS, default="cnn-cifar")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 2 clients, 2 rounds, narrow models")
    parser.add_argument("--out", type=Path, default=Path("runs/zoo_side_by_side"))
    parser.add_argument("--torch-python", default=None,
                        help="a Python with torch (default: this one, else " + PEERS_PYTHON + ")")
    parser.add_argument("--timeout", type=int, default=3600)
    parser.add_argument("--skip", nargs="*", default=[], metavar="KEY",
                        help="contenders left out, e.g. mcfl-xla (flax nn.Conv: ~5x slower "
                        "on CPU, for the ResNet tens of minutes)")
    args = parser.parse_args()
    torch_python = args.torch_python or default_torch_python()
    if torch_python is None:
        print("no Python with torch found: the PyTorch loop is skipped (see "
              "benchmarks/peers/README.md to install it)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    quick = ["--quick"] if args.quick else []
    results = {}
    for key, command in contenders(args.model, torch_python):
        if key in args.skip:
            continue
        check = run_json(command + ["--check", "--check-clients", "2"] + quick,
                         args.out / f"{key}-check.json", args.timeout, {})
        print(f"{key}: check ok, {check['params']:,} parameters", flush=True)
        start = time.perf_counter()
        result = run_json(command + ["--clients", str(args.clients), "--rounds",
                                     str(args.rounds)] + quick, args.out / f"{key}.json",
                          args.timeout, {})
        result["wall_seconds"] = time.perf_counter() - start
        results[key] = result
        print(f"{key}: {result['seconds_per_round']:.3f} s/round", flush=True)
    machine = {"processor": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "python": platform.python_version()}
    first = next(iter(results.values()))
    summary = {"model": args.model, "model_args": first["model_args"],
               "clients": first["clients"], "rounds": first["rounds"], "quick": args.quick,
               "machine": machine, "results": results}
    (args.out / "zoo_side_by_side.json").write_text(json.dumps(summary, indent=2) + "\n")
    mcfl = results["mcfl"]["seconds_per_round"]
    print(f"\n{args.model} ({first['params']:,} parameters), {first['clients']} clients, "
          f"5 local steps of B = 10{' (--quick: not a measurement)' if args.quick else ''}\n")
    print("| contender | s/round (mean / min) | first round | x mcfl |")
    print("| --- | --- | --- | --- |")
    for r in results.values():
        s = r["seconds_per_round"]
        print(f"| {r['name']} | {s:.3f} / {r['seconds_per_round_min']:.3f} | "
              f"{r['first_round_seconds']:.2f} s | {s / mcfl:.2f} |")


if __name__ == "__main__":
    main()
