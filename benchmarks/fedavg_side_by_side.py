"""One FedAvg round of a fixed workload, mcfl next to its peers and the ceiling, in one run.

    .venv/bin/python benchmarks/fedavg_side_by_side.py --clients 1000 --rounds 4 --out runs/peers
    .venv/bin/python benchmarks/fedavg_side_by_side.py --model cnn --rounds 4 --out runs/peers-cnn

`--model mlp` (default): MLP 784-200-200-10, C clients x 5 steps of B = 10 (`workload.py`).
`--model cnn`: FlexCFL's FashionMNIST CNN, 20 clients x 12 steps of B = 10 (`cnn_workload.py`);
contenders: the ceiling with each convolution code (matmul, flax nn.Conv), mcfl (factored dense
kernel on one device, on one device per core, and kept dense), and the PyTorch loop.

Runs, one after another, each in its own process (so none shares threads, caches or memory
with another): the centralized ceiling and mcfl's FedAvg (low-rank auto on one device; on a
multi-core CPU also with one forced XLA host device per core, `--devices` = cores; and low-rank
forced off) from this Python; fedjax 0.0.17 and the PyTorch per-client loop from the peers venv
(`--peers-python`, see benchmarks/peers/README.md; skipped with a note when it is missing).
Every contender first passes `--check` against the NumPy oracle (20 clients), then is timed.
Prints a Markdown table (steady s/round, ratios to mcfl and to the ceiling) and writes
OUT/side_by_side.json.
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

PEERS = Path(__file__).resolve().parent / "peers"
ROOT = PEERS.parent.parent


def cnn_contenders(peers_python: str | None) -> list[tuple[str, list[str], bool, dict]]:
    """The CNN round's contenders (see the module docstring)."""
    here = [sys.executable, str(PEERS / "mcfl_cnn_round.py")]
    out = [
        ("centralized", here + ["--centralized", "--conv", "matmul"], False, {}),
        ("centralized-xla", here + ["--centralized", "--conv", "xla"], False, {}),
        ("mcfl", here + ["--low-rank", "auto"], True, {}),
    ]
    cores = os.cpu_count() or 1
    if cores > 1:
        flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={cores}"
        out.append(("mcfl-devices", here + ["--devices", str(cores)], True,
                    {"XLA_FLAGS": flags.strip()}))
    out.append(("mcfl-dense", here + ["--low-rank", "off"], True, {}))
    if peers_python:
        out.append(("torch", [peers_python, str(PEERS / "torch_cnn_round.py")], True, {}))
    return out


def contenders(peers_python: str | None) -> list[tuple[str, list[str], bool, dict]]:
    """(key, command, checkable, extra environment) of each contender."""
    here = [sys.executable, str(PEERS / "mcfl_round.py")]
    out = [
        ("centralized", here + ["--centralized"], False, {}),
        ("mcfl", here + ["--low-rank", "auto"], True, {}),
    ]
    cores = os.cpu_count() or 1
    if cores > 1:  # one XLA CPU device per core, the clients' blocks dealt over them
        flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={cores}"
        out.append(("mcfl-devices", here + ["--low-rank", "auto", "--devices", str(cores)], True,
                    {"XLA_FLAGS": flags.strip()}))
    out.append(("mcfl-per-client", here + ["--low-rank", "off"], True, {}))
    if peers_python:
        out.append(("fedjax", [peers_python, str(PEERS / "fedjax_round.py")], True, {}))
        out.append(("torch", [peers_python, str(PEERS / "torch_round.py")], True, {}))
    return out


def run_json(command: list[str], path: Path, timeout: int, extra_env: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra_env}
    done = subprocess.run(command + ["--json", str(path)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return json.loads(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--clients", type=int, default=None,
                        help="default: 1000 for the MLP, 20 for the CNN")
    parser.add_argument("--check-clients", type=int, default=None,
                        help="clients of the NumPy check (default: 20 MLP, 4 CNN)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("runs/side_by_side"))
    default_peers = "/work/peers-venv/bin/python"
    parser.add_argument("--peers-python", default=default_peers if Path(default_peers).exists()
                        else None)
    parser.add_argument("--timeout", type=int, default=1800)
    args = parser.parse_args()
    cnn = args.model == "cnn"
    args.clients = args.clients or (20 if cnn else 1000)
    check_clients = args.check_clients or (4 if cnn else 20)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for key, command, checkable, extra_env in (cnn_contenders if cnn else contenders)(
            args.peers_python):
        if checkable:
            # The CNN is checked on random data: on images with flat background, max-pool
            # windows tie, and PyTorch sends a tie's gradient to one input where JAX (and the
            # oracle) split it (max |diff| 1.8e-4 on Fashion-MNIST); random data has no ties.
            data = ["--data", "random"] if cnn else []
            check = run_json(command + ["--check", "--check-clients", str(check_clients)] + data,
                             args.out / f"{key}-check.json", args.timeout, extra_env)
            print(f"{key}: check max |diff| {check['check']['max_abs_diff']:.2e}", flush=True)
        start = time.perf_counter()
        result = run_json(command + ["--clients", str(args.clients), "--rounds",
                                     str(args.rounds)], args.out / f"{key}.json", args.timeout,
                          extra_env)
        result["wall_seconds"] = time.perf_counter() - start
        results[key] = result
        print(f"{key}: {result['seconds_per_round']:.3f} s/round", flush=True)
    machine = {"processor": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "python": platform.python_version()}
    summary = {"model": args.model, "clients": args.clients, "rounds": args.rounds,
               "machine": machine, "results": results}
    (args.out / "side_by_side.json").write_text(json.dumps(summary, indent=2) + "\n")
    # the ceiling: the fastest centralized run
    ceiling = min(r["seconds_per_round"] for k, r in results.items()
                  if k.startswith("centralized"))
    mcfl = results["mcfl"]["seconds_per_round"]
    what = ("FashionMNIST CNN (3.27 M parameters), 12 local steps of B = 10" if cnn
            else "MLP 784-200-200-10, 5 local steps of B = 10")
    print(f"\n{args.clients} clients, {what}\n")
    print("| contender | s/round (mean / min) | first round | x ceiling | x mcfl |")
    print("| --- | --- | --- | --- | --- |")
    for r in results.values():
        s = r["seconds_per_round"]
        print(f"| {r['name']} | {s:.3f} / {r['seconds_per_round_min']:.3f} | "
              f"{r['first_round_seconds']:.2f} s | {s / ceiling:.2f} | {s / mcfl:.2f} |")


if __name__ == "__main__":
    main()
