"""The speed regression guard: the headline workloads for this tree and a baseline commit,
interleaved and repeated, each ratio with its spread.

    .venv/bin/python benchmarks/regression.py --baseline 35c760d --out runs/regression
    .venv/bin/python benchmarks/regression.py --baseline HEAD~3 --workloads fesem-100k --repeats 5

This machine's noise is as large as the margins a speed change claims (issue 42: the same pair
of commits measured 2.25 / 1.89 s alone and 3.12 / 3.14 s beside another job), so one timing
of each side says nothing. Here the baseline commit is extracted once (`git archive`) into
``OUT/trees/SHA`` and imported from there (``PYTHONPATH``), beside the working tree as it is
(uncommitted changes included); every workload runs in its own process for each side, the two
sides alternating which goes first, `--repeats` times. Each process measures with the scripts
of its own tree (`benchmarks/peers/`, `mcfl bench`), so a workload is what that tree's scripts
make of it. Per workload it prints the median seconds per round of each side and the ratio
current / baseline: its median over the repeats and its range (min-max). Below 1 is faster.

Workloads (`--workloads`, default all but ``cnn-cifar``):
  cnn-round    FedAvg on FlexCFL's Fashion-MNIST CNN: 20 clients x 12 steps of B = 10
               (`peers/mcfl_cnn_round.py`, random data; the PyTorch loop's workload);
  full-mlp     FedAvg, MLP 784-200-200-10, 1,000 clients, all of them a round, 5 steps
               (`mcfl bench`);
  char-lstm    a zoo model: FedAvg on LEAF's Shakespeare LSTM, 20 clients x 5 steps of B = 10
               (`peers/mcfl_zoo_round.py`);
  fesem-100k   FeSEM (K = 4), MCLR, 100,000 clients, 100 a round, 30 rounds (`mcfl bench`):
               the fixed costs of small rounds;
  cnn-cifar    the zoo's CIFAR CNN (`peers/mcfl_zoo_round.py`).

It refuses to report when another job shares the machine: before it starts, the 1-minute load
average must be under `--max-load` (0.8), and before every process the count of runnable processes
(``/proc/stat``'s procs_running, sampled for 2 s, waiting up to a minute for it to settle)
must say nobody else is running. Anything measured while another job ran makes it exit 3 with
the reason instead of a table (`--force`: print it anyway, marked). OUT/regression.json is
rewritten (atomically) after every process, and a second call with the same OUT and settings
goes on from the measurements it holds: Ctrl-C or a kill loses at most the process under way.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mcfl.files.atomic import write_json  # noqa: E402

BUSY = 3  # exit status when another job shared the machine

WORKLOADS = {
    "cnn-round": ("peer", ["benchmarks/peers/mcfl_cnn_round.py", "--clients", "20",
                           "--rounds", "6", "--data", "random"]),
    "full-mlp": ("bench", ["--algorithms", "fedavg", "--models", "mlp", "--clients", "1000",
                           "--rounds", "6"]),
    "char-lstm": ("peer", ["benchmarks/peers/mcfl_zoo_round.py", "--model", "char-lstm",
                           "--rounds", "5"]),
    "fesem-100k": ("bench", ["--algorithms", "fesem", "--models", "mclr", "--clients", "100000",
                             "--clients-per-round", "100", "--rounds", "30"]),
    "cnn-cifar": ("peer", ["benchmarks/peers/mcfl_zoo_round.py", "--model", "cnn-cifar",
                           "--rounds", "4"]),
}
DEFAULT_WORKLOADS = ("cnn-round", "full-mlp", "char-lstm", "fesem-100k")


def fail(message: str) -> int:
    print(f"regression: {message}", file=sys.stderr)
    return 2


def resolve_commit(revision: str) -> str:
    found = subprocess.run(["git", "rev-parse", "--verify", f"{revision}^{{commit}}"], cwd=ROOT,
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise ValueError(f"--baseline {revision!r} is not a commit of {ROOT}")
    return found.stdout.strip()


def baseline_tree(commit: str, trees: Path) -> Path:
    """The baseline commit's files under ``trees/SHA`` (extracted once, renamed into place)."""
    tree = trees / commit
    if (tree / "mcfl" / "__init__.py").is_file():
        return tree
    trees.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=trees, prefix=f".{commit[:12]}."))
    archive = subprocess.Popen(["git", "archive", commit], cwd=ROOT, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(partial)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    shutil.rmtree(tree, ignore_errors=True)
    os.replace(partial, tree)
    return tree


def runnable_others(seconds: float = 2.0) -> float:
    """Mean count of runnable processes besides this one over `seconds` (/proc/stat)."""
    samples = []
    for _ in range(int(seconds / 0.1)):
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("procs_running"):
                    samples.append(int(line.split()[1]) - 1)
        time.sleep(0.1)
    return statistics.fmean(samples) if samples else 0.0


def quiet(wait: float) -> tuple[bool, float]:
    """(whether the machine is quiet, the last runnable count), waiting up to `wait` s."""
    deadline = time.monotonic() + wait
    while True:
        others = runnable_others()
        if others <= 0.5 or time.monotonic() > deadline:
            return others <= 0.5, others
        time.sleep(3)


def measure(name: str, tree: Path, timeout: float) -> dict:
    """One process of workload `name` on `tree`: its seconds per round, or the failure."""
    kind, arguments = WORKLOADS[name]
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory(prefix="mcfl-regression-") as scratch:
        if kind == "peer":
            result = Path(scratch) / "result.json"
            command = [sys.executable, str(tree / arguments[0]), *arguments[1:],
                       "--json", str(result)]
        else:
            result = Path(scratch) / "bench" / "bench.json"
            command = [sys.executable, "-m", "mcfl", "bench", *arguments,
                       "--out", str(result.parent)]
        start = time.perf_counter()
        try:
            done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        wall = time.perf_counter() - start
        if done.returncode != 0 or not result.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return {"error": f"exit {done.returncode}: {tail[0][:300]}"}
        document = json.loads(result.read_text())
    if kind == "bench":
        point = document["points"][0]
        if point.get("status") != "ok":
            return {"error": point.get("error", "the point failed")}
        seconds = point["seconds_per_round"]
    else:
        seconds = document["seconds_per_round"]
    return {"seconds_per_round": seconds, "wall_seconds": wall}


def summarise(document: dict, workloads: list[str]) -> list[dict]:
    rows = []
    for name in workloads:
        runs = [m for m in document["measurements"] if m["workload"] == name
                and "seconds_per_round" in m]
        by_repeat: dict[int, dict[str, float]] = {}
        for m in runs:
            by_repeat.setdefault(m["repeat"], {})[m["side"]] = m["seconds_per_round"]
        ratios = [pair["current"] / pair["baseline"] for pair in by_repeat.values()
                  if len(pair) == 2]
        sides = {side: [m["seconds_per_round"] for m in runs if m["side"] == side]
                 for side in ("baseline", "current")}
        rows.append({
            "workload": name, "pairs": len(ratios),
            "baseline_s": statistics.median(sides["baseline"]) if sides["baseline"] else None,
            "current_s": statistics.median(sides["current"]) if sides["current"] else None,
            "ratio": statistics.median(ratios) if ratios else None,
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
        })
    return rows


def table(rows: list[dict], document: dict) -> str:
    dirty = " (with uncommitted changes)" if document["dirty"] else ""
    lines = [f"baseline {document['baseline'][:10]} against the working tree at "
             f"{document['current'][:10]}{dirty}; {document['cpu']}",
             "| workload | baseline s/round | current s/round | current / baseline | range "
             "| pairs |",
             "| --- | ---: | ---: | ---: | --- | ---: |"]
    for r in rows:
        if r["ratio"] is None:
            lines.append(f"| {r['workload']} | | | failed | | 0 |")
            continue
        lines.append(f"| {r['workload']} | {r['baseline_s']:.4g} | {r['current_s']:.4g} | "
                     f"**{r['ratio']:.2f}** | {r['ratio_min']:.2f}-{r['ratio_max']:.2f} | "
                     f"{r['pairs']} |")
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the commit to compare against")
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                        help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--repeats", type=int, default=3, help="pairs per workload (>= 1)")
    parser.add_argument("--out", type=Path, default=Path("runs/regression"))
    parser.add_argument("--max-load", type=float, default=0.8,
                        help="the 1-minute load average above which it refuses to start "
                        "(another job on its own keeps it near 1 or above)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per process")
    parser.add_argument("--force", action="store_true",
                        help="report even when another job shared the machine (marked)")
    args = parser.parse_args(argv)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or not workloads:
        return fail(f"--workloads {args.workloads!r}: expected names among "
                    f"{', '.join(WORKLOADS)}")
    if args.repeats < 1:
        return fail(f"--repeats {args.repeats}: expected at least 1")
    load = os.getloadavg()[0]
    if load > args.max_load and not args.force:
        print(f"regression: refused: the 1-minute load average is {load:.2f} (> --max-load "
              f"{args.max_load}); another job is running", file=sys.stderr)
        return BUSY
    try:
        baseline = resolve_commit(args.baseline)
        out = args.out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".writable"
        probe.write_text("")
        probe.unlink()
    except (ValueError, OSError) as error:
        return fail(str(error))
    current = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=ROOT, capture_output=True, text=True).stdout.strip())
    settings = {"baseline": baseline, "workloads": workloads, "repeats": args.repeats}
    path = out / "regression.json"
    document = json.loads(path.read_text()) if path.is_file() else {}
    if document.get("settings") != settings:
        document = {"settings": settings, "measurements": []}
    document.update(baseline=baseline, current=current, dirty=dirty, cpu=cpu_name())
    done = {(m["repeat"], m["workload"], m["side"]) for m in document["measurements"]}
    trees = {"baseline": baseline_tree(baseline, out / "trees"), "current": ROOT}
    for repeat in range(args.repeats):
        sides = ("baseline", "current") if repeat % 2 == 0 else ("current", "baseline")
        for name in workloads:
            for side in sides:
                if (repeat, name, side) in done:
                    continue
                calm, others = quiet(wait=60)
                record = measure(name, trees[side], args.timeout)
                record.update(repeat=repeat, workload=name, side=side, busy=not calm,
                              runnable_others=others, at=time.strftime("%Y-%m-%dT%H:%M:%S"))
                document["measurements"].append(record)
                write_json(path, document)
                shown = (f"{record['seconds_per_round']:.4g} s/round" if "seconds_per_round"
                         in record else record["error"])
                print(f"[{repeat + 1}/{args.repeats}] {name:<11} {side:<8} {shown}"
                      f"{'  (another job was running)' if not calm else ''}", flush=True)
    rows = summarise(document, workloads)
    document["summary"] = rows
    write_json(path, document)
    busy = [m for m in document["measurements"] if m["busy"]]
    if busy and not args.force:
        print(f"regression: refused: {len(busy)} of {len(document['measurements'])} "
              f"measurements ran beside another job (runnable processes up to "
              f"{max(m['runnable_others'] for m in busy):.1f}); rerun when the machine is "
              f"quiet, with a new --out", file=sys.stderr)
        return BUSY
    print(table(rows, document))
    if busy:
        print(f"(--force: {len(busy)} measurements ran beside another job)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
