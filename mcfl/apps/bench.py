"""`mcfl bench`: round time, samples/s and peak memory against the number of clients.

Every point of the sweep (an algorithm, a model and a number of clients; or the clustering step
alone) runs in its own Python process (`mcfl.apps.bench_point`), so its peak resident memory is
its own and a point that runs out of memory or hangs costs only that point.

The parent never initialises a JAX backend (on a GPU it would take the device's memory from the
children): it plans the points, starts the children, and writes ``bench.json`` after every
point and ``bench.png`` at the end.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Optional

import jax

from mcfl.apps.bench_point import CLUSTERING, Point, point_settings, training_config
from mcfl.errors import ConfigError, choice_error
from mcfl.files import atomic
from mcfl.files.figures import save_figure
from mcfl.files.run_folder import json_safe
from mcfl.runs.plan import resolve
from mcfl.settings import split_list

DEFAULT_ALGORITHMS = ("fedavg", "fesem", "ifca", "flexcfl")
DEFAULT_MODELS = ("mclr", "mlp")
DEFAULT_CLIENTS = (100, 1_000, 10_000, 100_000)
MLP_DEFAULT_MAX_CLIENTS = 10_000  # the issue's 100,000-client points are for MCLR only


def failure_message(returncode: int, stderr: str) -> str:
    """One line saying why a child failed: the signal that killed it, or its last error line."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        return f"killed by {name}{hint}"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exited with code {returncode}"


def child_env() -> dict[str, str]:
    """The environment of a child: this one, with mcfl importable even when not installed."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the mcfl package
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def run_point(point: Point, timeout: Optional[float] = None, compile_cache: bool = True) -> dict:
    """Measure `point` in a fresh Python process (with JAX's persistent compilation cache
    unless not `compile_cache`); a failure (error, out of memory, killed, over `timeout`
    seconds) comes back as a record with status "failed" and the error."""
    command = [sys.executable, "-m", "mcfl.apps.bench_point", "--point",
               json.dumps(dataclasses.asdict(point)),
               *([] if compile_cache else ["--no-compile-cache"])]
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=child_env())
    except subprocess.TimeoutExpired:
        error = f"timed out after {timeout:g} s"
    else:
        error = None if proc.returncode == 0 else failure_message(proc.returncode, proc.stderr)
    wall = time.perf_counter() - start
    if error is not None:
        return {**point_settings(point), "status": "failed", "error": error, "wall_seconds": wall}
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    record["wall_seconds"] = wall
    return record


def plan_points(
    algorithms: Sequence[str],
    models: Sequence[str],
    clients: Sequence[int],
    clustering: bool = True,
    max_mlp_clients: Optional[int] = None,
    **settings,
) -> tuple[list[Point], list[str]]:
    """The points of a sweep, smallest client counts first, and a line for each point left out
    (MLP above `max_mlp_clients`). `settings` are further `Point` fields (rounds, clusters...).
    Raises ConfigError for a point whose run config is invalid (e.g. K above the clients)."""
    names = list(algorithms) + ([CLUSTERING] if clustering else [])
    points, skipped = [], []
    for n in sorted(set(clients)):
        for model in models:
            if model == "mlp" and max_mlp_clients is not None and n > max_mlp_clients:
                skipped.append(f"mlp at {n:,} clients (the default sweep runs it up to "
                               f"{max_mlp_clients:,}; pass --clients to include it)")
                continue
            for name in names:
                point = Point(name, model, n, **settings)
                _check_point(point)
                points.append(point)
    return points, skipped


def _check_point(point: Point) -> None:
    if point.kind == "train":
        resolve(training_config(point))  # raises ConfigError naming the bad value
    elif point.clusters > point.clients:
        raise ConfigError(f"clusters (K = {point.clusters}) cannot exceed the number of clients "
                          f"({point.clients}) of the clustering step")


def machine_info() -> dict:
    """Versions and hardware of this machine (the backend and device come from the points)."""
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "jax_version": jax.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "backend": None,
        "device": None,
    }


def write_json(path: Path, document: dict) -> None:
    """Write `document` to `path` whole (`mcfl.files.atomic`), so a reader never sees half."""
    atomic.write_json(path, json_safe(document))


def run_sweep(
    points: Iterable[Point],
    out_dir: Path,
    timeout: Optional[float] = None,
    skipped: Sequence[str] = (),
    report: Optional[Callable[[dict], None]] = None,
    compile_cache: bool = True,
) -> dict:
    """Measure every point in its own process, rewriting out_dir/bench.json after each one, and
    plot out_dir/bench.png at the end (also after Ctrl-C). `report(record)` is called after each
    point; `compile_cache`: whether the children keep their programs in JAX's persistent
    cache. Returns the JSON document."""
    out_dir = Path(out_dir)
    document = {"machine": machine_info(), "skipped": list(skipped), "points": []}
    write_json(out_dir / "bench.json", document)
    try:
        for point in points:
            record = run_point(point, timeout, compile_cache)
            document["points"].append(record)
            if document["machine"]["backend"] is None and record["status"] == "ok":
                document["machine"].update(backend=record["backend"], device=record["device"])
            write_json(out_dir / "bench.json", document)
            if report is not None:
                report(record)
    finally:
        plot_bench(out_dir / "bench.png", document["points"])
    return document


# ----------------------------------------------------------------------------------------------
# Output


def plot_bench(path: Path, points: Sequence[dict]) -> None:
    """Log-log PNG: seconds per round (left) and peak resident memory (right) against the
    number of clients, one line per algorithm and model; failed points are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (algorithm, model), line in _lines(points).items():
        x = [p["clients"] for p in line]
        style = {"marker": "o", "linestyle": "--" if algorithm == CLUSTERING else "-"}
        label = f"{algorithm} ({model})"
        ax_time.plot(x, [p["seconds_per_round"] for p in line], label=label, **style)
        ax_mem.plot(x, [p["peak_rss_mb"] for p in line], label=label, **style)
    ax_time.set(xlabel="clients", ylabel="seconds per round (steady state)",
                title="round time (kmeans: one clustering step)")
    ax_mem.set(xlabel="clients", ylabel="peak resident memory (MB)", title="peak memory")
    for ax in (ax_time, ax_mem):
        ax.set(xscale="log", yscale="log")
        ax.grid(alpha=0.3, which="both")
        if ax.lines:
            ax.legend(fontsize=8)
    save_figure(fig, path)


def _lines(points: Sequence[dict]) -> dict[tuple[str, str], list[dict]]:
    """Successful points grouped by (algorithm, model), each group sorted by clients."""
    lines: dict[tuple[str, str], list[dict]] = {}
    for p in points:
        if p["status"] == "ok":
            lines.setdefault((p["algorithm"], p["model"]), []).append(p)
    return {key: sorted(line, key=lambda p: p["clients"]) for key, line in lines.items()}


TABLE_HEADER = (f"{'algorithm':<9} {'model':<10} {'clients':>9} {'per round':>9} "
                f"{'round 1 s':>10} {'s/round':>9} {'samples/s':>10} {'peak MB':>8} "
                f"{'run MB':>7}  status")


def format_row(record: dict) -> str:
    """One line of the table printed as the sweep goes."""
    def number(key, spec):
        value = record.get(key)
        return "-" if value is None else format(value, spec)

    status = "ok" if record["status"] == "ok" else f"FAILED: {record['error']}"
    per_round = number("clients_per_round", ",") if record["kind"] == "train" else "-"
    return (f"{record['algorithm']:<9} {record['model']:<10} {record['clients']:>9,} "
            f"{per_round:>9} "
            f"{number('first_round_seconds', '.3f'):>10} {number('seconds_per_round', '.3f'):>9} "
            f"{number('samples_per_second', ',.0f'):>10} {number('peak_rss_mb', ',.0f'):>8} "
            f"{number('run_peak_rss_mb', ',.0f'):>7}  {status}")


# ----------------------------------------------------------------------------------------------
# Command-line values


def parse_names(text: str, allowed: Sequence[str], what: str) -> tuple[str, ...]:
    """'fedavg,ifca' -> ('fedavg', 'ifca'), each checked against `allowed`."""
    names = tuple(split_list(text, f"the list of {what}s", allowed[0]))
    for name in names:
        if name not in allowed:
            raise choice_error(what, name, allowed)
    return names


def parse_counts(text: str) -> tuple[int, ...]:
    """'100,1000' -> (100, 1000); every count a positive integer ('10_000' and '1e4' allowed)."""
    counts = []
    for part in split_list(text, "the client counts", "100,1000"):
        try:
            value = float(part.replace("_", ""))
        except ValueError:
            value = math.nan
        if not (value >= 1 and value == int(value)):
            raise ConfigError(f"client counts must be positive integers, got {part!r} in {text!r}")
        counts.append(int(value))
    return tuple(counts)


