"""Command line, timing and correctness check shared by the peer benchmark scripts.

Standard library and NumPy only. A peer script supplies a *runner factory*
``make_runner(workload, args) -> runner`` (``args``: the parsed command line) and the workload
module it runs (``workload`` for the MLP round, ``cnn_workload`` for the CNN round; both give
``make_workload``, ``reference_round``, ``max_abs_diff``, ``LEARNING_RATE`` and
``DEFAULT_CLIENTS``); the runner starts from ``workload.params`` and has

- ``run_round()``: one full FedAvg round (all clients train + average), finished on return
  (any asynchronous work blocked on), making the result the new global model;
- ``global_params()``: the current global model as NumPy arrays in ``workload.py``'s layout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import workload as wl


class Runner(Protocol):
    """What a peer implementation provides (see the module docstring)."""

    def run_round(self) -> None: ...

    def global_params(self) -> dict[str, np.ndarray]: ...


RunnerFactory = Callable[[wl.Workload, argparse.Namespace], Runner]
Describe = Callable[[argparse.Namespace], dict]
AddArguments = Callable[[argparse.ArgumentParser], None]


def parse_args(add_arguments: AddArguments | None = None,
               argv: list[str] | None = None, default_clients: int = 1000) -> argparse.Namespace:
    """The common command line of the peer scripts, plus a script's own options."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=default_clients,
                        help=f"clients C (default {default_clients})")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds to time; the first is reported apart (compilation)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", choices=("auto", "fmnist", "random"), default="auto")
    parser.add_argument("--json", type=Path, help="write the result here as JSON")
    parser.add_argument("--check", action="store_true",
                        help="run 1 round on --check-clients clients and compare with NumPy")
    parser.add_argument("--check-clients", type=int, default=20)
    parser.add_argument("--tol", type=float, default=1e-4,
                        help="largest max-abs parameter difference --check accepts")
    if add_arguments is not None:
        add_arguments(parser)
    return parser.parse_args(argv)


def time_rounds(runner: Runner, rounds: int) -> list[float]:
    """Wall-clock seconds of each of ``rounds`` consecutive rounds."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        runner.run_round()
        times.append(time.perf_counter() - start)
    return times


def summarize(times: list[float]) -> dict:
    """First round apart; steady state = mean and min of the rest (or the first if alone)."""
    steady = times[1:] or times
    return {
        "seconds_per_round": statistics.fmean(steady),
        "seconds_per_round_min": min(steady),
        "first_round_seconds": times[0],
        "round_seconds": times,
    }


def check(make_runner: RunnerFactory, args: argparse.Namespace,
          workload=wl) -> tuple[bool, dict]:
    """One round on a small workload against ``workload.reference_round``."""
    work = workload.make_workload(args.check_clients, args.seed, args.data)
    runner = make_runner(work, args)
    runner.run_round()
    expected = workload.reference_round(work.x, work.y, work.params, workload.LEARNING_RATE)
    diff = workload.max_abs_diff(runner.global_params(), expected)
    moved = workload.max_abs_diff(work.params, expected)
    ok = bool(np.isfinite(diff) and diff <= args.tol)
    return ok, {"clients": args.check_clients, "max_abs_diff": diff,
                "max_abs_update": moved, "tol": args.tol, "ok": ok, "source": work.source}


def benchmark(make_runner: RunnerFactory, args: argparse.Namespace, workload=wl) -> dict:
    """Time ``args.rounds`` rounds on ``args.clients`` clients."""
    work = workload.make_workload(args.clients, args.seed, args.data)
    setup_start = time.perf_counter()
    runner = make_runner(work, args)
    setup = time.perf_counter() - setup_start
    result = summarize(time_rounds(runner, args.rounds))
    return {"clients": args.clients, "rounds": args.rounds, "setup_seconds": setup, **result,
            "source": work.source}


def main(make_runner: RunnerFactory, describe: Describe, add_arguments: AddArguments | None = None,
         argv: list[str] | None = None, workload=wl) -> int:
    """Run a peer script: ``--check`` or a timing; print and optionally write JSON.

    ``describe(args)`` gives the result's ``name`` and the versions/settings to report.
    """
    args = parse_args(add_arguments, argv, getattr(workload, "DEFAULT_CLIENTS", 1000))
    about = describe(args)
    if args.check:
        ok, outcome = check(make_runner, args, workload)
        result = {"name": about["name"], "check": outcome, **about}
    else:
        ok, result = True, {"name": about["name"], **benchmark(make_runner, args, workload),
                            **about}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    if not ok:
        print(f"CHECK FAILED: max_abs_diff {result['check']['max_abs_diff']:.3g} > {args.tol:g}",
              file=sys.stderr)
    return 0 if ok else 1
