"""A sweep against one run and against a loop of single runs, wall time and peak memory.

    .venv/bin/python benchmarks/sweep_vs_loop.py --out runs/sweep-bench

Workloads (Synthetic(1,1), MCLR, B = 10, E = 1, lr 0.01; FlexCFL's Table III setting):
- fedavg-8-seeds: FedAvg, 100 clients, 20 a round, 50 rounds, seeds 0-7;
- fesem-4lr-4-seeds: FeSEM (K = 4), same data, lr in {0.005, 0.01, 0.02, 0.05} x seeds 0-3;
- fedavg-16-members-1000-clients: FedAvg, 1,000 clients, 20 a round, 20 rounds, 4 lr x 4
  seeds (memory).
For each: `mcfl run` of one member, `mcfl sweep` of all of them, and (the first two) a Python
loop of `mcfl.run` over the members, each in its own process, one after another, timed from
the parent (interpreter start, imports, data, compilation, training and writing results all
included) with the child's peak resident memory. JAX's persistent compilation cache is off
for every contender (a fresh machine's first run; the loop's later runs would otherwise reuse
the first one's programs); `--compile-cache` turns it on for all. Writes OUT/sweep_bench.json
and prints a Markdown table.
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

COMMON = ["--dataset", "synthetic", "--model", "mclr", "--batch-size", "10", "--lr", "0.01",
          "--clients-per-round", "20", "--embed-clients", "0", "--no-cache"]

WORKLOADS = {
    "fedavg-8-seeds": dict(
        run=["--algorithm", "fedavg", "--clients", "100", "--rounds", "50"],
        sweep=["--seeds", "0-7"], loop=[{"seed": s} for s in range(8)]),
    "fesem-4lr-4-seeds": dict(
        run=["--algorithm", "fesem", "--clusters", "4", "--clients", "100", "--rounds", "50"],
        sweep=["--seeds", "0-3", "--grid", "lr=0.005,0.01,0.02,0.05"],
        loop=[{"seed": s, "lr": lr} for lr in (0.005, 0.01, 0.02, 0.05) for s in range(4)]),
    "fedavg-16-members-1000-clients": dict(
        run=["--algorithm", "fedavg", "--clients", "1000", "--rounds", "20"],
        sweep=["--seeds", "0-3", "--grid", "lr=0.005,0.01,0.02,0.05"], loop=None),
}

# The child: run the mcfl command line (or the loop) and report its own peak memory.
CHILD = """
import json, resource, sys, time
argv, loop = json.loads(sys.argv[1]), json.loads(sys.argv[2])
if loop is None:
    from mcfl.apps.cli import main
    code = main(argv)
else:
    import mcfl
    from mcfl.apps.cli import build_parser, config_from_args, setup_compile_cache
    args = build_parser().parse_args(argv)
    setup_compile_cache(args)
    base = config_from_args(args)
    for i, changes in enumerate(loop):
        mcfl.run(base.replace(**changes), out_dir=f"{args.out}/member{i}", overwrite=True)
    code = 0
print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def timed(argv: list[str], loop, env) -> dict:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(argv), json.dumps(loop)],
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed: {argv}\n{done.stderr[-2000:]}")
    peak = [int(line.split()[1]) for line in done.stdout.splitlines()
            if line.startswith("PEAK_RSS_KB")][0]
    return {"wall_seconds": round(wall, 2), "peak_rss_gb": round(peak / 2**20, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/sweep-bench")
    parser.add_argument("--only", help="comma-separated workload names")
    parser.add_argument("--compile-cache", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    env = dict(os.environ)
    extra = [] if args.compile_cache else ["--no-compile-cache"]
    names = args.only.split(",") if args.only else list(WORKLOADS)
    results = {}
    for name in names:
        w = WORKLOADS[name]
        base = COMMON + w["run"] + extra
        again = ["--overwrite"]  # a rerun replaces the last one's folders
        row = {"run": timed(["run", *base, *again, "--out", str(out / name / "run")], None,
                            env),
               "sweep": timed(["sweep", *base, *w["sweep"], *again, "--out",
                               str(out / name / "sweep")], None, env)}
        if w["loop"] is not None:
            row["loop"] = timed(["run", *base, "--out", str(out / name / "loop")], w["loop"],
                                env)
        spec = json.loads((out / name / "sweep" / "sweep.json").read_text())
        row["members"] = spec["members"]
        row["members_per_chunk"] = [g["members_per_chunk"] for g in spec["groups_run"]]
        results[name] = row
        print(name, json.dumps(row), flush=True)
    machine = {"platform": platform.platform(), "cpus": os.cpu_count(),
               "python": platform.python_version(), "compile_cache": args.compile_cache}
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep_bench.json").write_text(json.dumps({"machine": machine, "results": results},
                                                     indent=2) + "\n")
    print("\n| workload | members | one run | sweep | loop | sweep / run | loop / sweep | "
          "peak run | peak sweep |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        loop = r.get("loop")
        print(f"| {name} | {r['members']} | {r['run']['wall_seconds']} s | "
              f"{r['sweep']['wall_seconds']} s | "
              f"{'-' if loop is None else str(loop['wall_seconds']) + ' s'} | "
              f"{r['sweep']['wall_seconds'] / r['run']['wall_seconds']:.2f}x | "
              f"{'-' if loop is None else format(loop['wall_seconds'] / r['sweep']['wall_seconds'], '.2f') + 'x'} | "  # noqa: E501
              f"{r['run']['peak_rss_gb']} GB | {r['sweep']['peak_rss_gb']} GB |")


if __name__ == "__main__":
    main()
