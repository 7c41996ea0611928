"""Golden outputs: every algorithm and the run's wrappers, recorded to compare two versions of
mcfl bit for bit (a refactor must leave them unchanged).

    .venv/bin/python benchmarks/golden_outputs.py record before.npz
    ... change the code ...
    .venv/bin/python benchmarks/golden_outputs.py record after.npz
    .venv/bin/python benchmarks/golden_outputs.py compare before.npz after.npz

Each case is an `mcfl.run` (or `mcfl.sweep`) through the public API on a small problem: every
registered algorithm on Synthetic(1,1) (30 clients, 8 a round, 3 rounds, MCLR, 2 local steps,
K = 3), FedAvg and IFCA with an MLP (the low-rank path) and a CNN (the factored dense layer
and matmul convolutions), the three distribution shifts, the round-robin schedule, FedBN's
local layers, the host client store, and three sweeps. What is recorded: every round's metrics
(timings dropped), every client's evaluated metrics, and the assignments of a clustered run;
`compare` names each array that differs and by how much. `--only a,b` records some cases.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

TIMING = ("seconds", "wall_seconds", "compile_seconds", "init_seconds")
# (flhc_warmup 1: FL+HC's clustering round, round 2, within the 3 rounds; its default 10 is
# refused in a run of fewer rounds, which it would leave plain FedAvg)
SMALL = {"pretrain_scale": 2, "cfl_warmup": 1, "fesem_restarts": 2, "flhc_warmup": 1}
LAYERED = ("fedper", "lg_fedavg", "fedrep")


def base_config(sweep_base: bool = False, **changes):
    import mcfl
    from mcfl.algorithms import get

    settings = dict(dataset="synthetic", clients=30, clients_per_round=8, rounds=3,
                    eval_every=1, model="mclr", local_steps=2, batch_size=10, clusters=3,
                    seed=1, lr=0.05, embed_clients=0)
    settings.update(changes)
    if not get(settings.get("algorithm", "fedavg")).clustered:
        # K and the embedding are the clustered algorithms' own (a run refuses them otherwise;
        # a sweep over algorithms keeps them for its clustered members)
        if not sweep_base:
            settings.pop("clusters")
            settings.pop("embed_clients")
    return mcfl.RunConfig(**settings)


def algorithm_config(name: str, **changes):
    from mcfl import settings
    from mcfl.algorithms import get

    takes = settings.fields_of(get(name).params)
    extra = {k: v for k, v in SMALL.items() if k in takes}
    if name in LAYERED:
        extra.update(model="mlp", hidden=(8,))
    config = base_config(algorithm=name, **extra, **changes)
    # what a run of `name` refuses as unused, at its default (the same run: it was unused)
    unused = {"clients_per_round": None} if get(name).asynchronous else {}
    if name == "cflgp":  # its gradient protocol trains nothing locally
        unused.update(lr=0.01, local_steps=None)
    if name == "fedsgd":  # a full-batch gradient: no local steps
        unused.update(local_steps=None)
    return config.replace(**unused) if unused else config


def image_data(num_clients: int = 12):
    """12 clients of random 8 x 8 x 3 images, 10 classes (the CNN cases)."""
    import mcfl

    rng = np.random.default_rng(0)
    clients = [(rng.standard_normal((20, 8, 8, 3)).astype(np.float32),
                rng.integers(0, 10, 20)) for _ in range(num_clients)]
    return mcfl.data.from_clients(clients, num_classes=10, seed=0)


def cases() -> dict:
    """name -> a function returning (kind, result)."""
    import mcfl
    from mcfl.algorithms import names

    out = {}
    for name in names():
        out[f"algorithm-{name}"] = lambda name=name: ("run", mcfl.run(algorithm_config(name)))
    out["mlp-fedavg"] = lambda: ("run", mcfl.run(base_config(
        algorithm="fedavg", model="mlp", hidden=(16, 16))))
    out["mlp-ifca"] = lambda: ("run", mcfl.run(base_config(
        algorithm="ifca", model="mlp", hidden=(16, 16))))
    out["mlp-local-host-store"] = lambda: ("run", mcfl.run(base_config(
        algorithm="local", model="mlp", hidden=(16,), client_store="host")))
    for algorithm in ("fedavg", "ifca"):
        out[f"cnn-{algorithm}"] = lambda algorithm=algorithm: ("run", mcfl.run(
            base_config(algorithm=algorithm, clients=12, clients_per_round=4,
                        model="cnn-cifar", clusters=2), dataset=image_data()))
    out["cnn-bn-local-fedavg"] = lambda: ("run", mcfl.run(
        base_config(algorithm="fedavg", clients=12, clients_per_round=4,
                    model="cnn-cifar-bn", bn="local"), dataset=image_data()))
    for algorithm, shift in (("fedavg", "swap_all"), ("ifca", "swap_part"),
                             ("flexcfl", "incremental"), ("ditto", "swap_all")):
        # (a swap's chance, incremental's interval: each shift takes its own)
        own = {"shift_interval": 1} if shift == "incremental" else {"shift_prob": 0.7}
        out[f"shift-{shift}-{algorithm}"] = lambda a=algorithm, s=shift, own=own: (
            "run", mcfl.run(algorithm_config(a, shift=s, rounds=4, **own)))
    for algorithm in ("flexcfl", "ifca", "ditto"):
        out[f"schedule-{algorithm}"] = lambda a=algorithm: ("run", mcfl.run(
            algorithm_config(a, client_sampling="round_robin_first")))
    out["scan-rounds-fesem"] = lambda: ("run", mcfl.run(
        algorithm_config("fesem", scan_rounds="on", eval_every=3)))
    out["sweep-fedavg-seeds"] = lambda: ("sweep", mcfl.sweep(
        base_config(algorithm="fedavg"), seeds=3))
    out["sweep-fesem-lr"] = lambda: ("sweep", mcfl.sweep(
        algorithm_config("fesem"), seeds=2, grid={"lr": [0.02, 0.05]}))
    out["sweep-algorithms"] = lambda: ("sweep", mcfl.sweep(
        base_config(True, algorithm="fedprox"), seeds=2,
        grid={"algorithm": ["fedprox", "ifca", "ditto"]}))
    return out


def _numeric(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value,
                                                                                      bool)


def flatten(kind: str, result) -> dict[str, np.ndarray]:
    """The arrays a case is compared on."""
    arrays = {}
    if kind == "run":
        rows = result.rounds
        for key in sorted({k for row in rows for k in row} - set(TIMING)):
            values = [row.get(key) for row in rows]
            if all(v is None or _numeric(v) for v in values):
                arrays[f"rounds/{key}"] = np.array(
                    [np.nan if v is None else v for v in values], np.float64)
        for key in sorted({k for row in result.clients for k in row}):
            values = [row.get(key) for row in result.clients]
            if all(v is None or _numeric(v) for v in values):
                arrays[f"clients/{key}"] = np.array(
                    [np.nan if v is None else v for v in values], np.float64)
        if result.assignments is not None:
            arrays["assignments"] = np.asarray(result.assignments)
    else:
        rows = result.rounds
        for key in sorted({k for row in rows for k in row} - set(TIMING)):
            values = [row.get(key) for row in rows]
            if all(v is None or v == "" or _numeric(v) for v in values):
                arrays[f"sweep-rounds/{key}"] = np.array(
                    [np.nan if v is None or v == "" else v for v in values], np.float64)
    return arrays


def record(path: str, only: list[str]) -> int:
    import jax

    all_cases = cases()
    chosen = only or list(all_cases)
    unknown = [c for c in chosen if c not in all_cases]
    if unknown:
        print(f"unknown cases {unknown}; known: {', '.join(all_cases)}", file=sys.stderr)
        return 2
    arrays, failed = {}, []
    for name in chosen:
        start = time.perf_counter()
        try:
            kind, result = all_cases[name]()
        except Exception as error:  # recorded: a case that fails before must fail after
            failed.append(name)
            arrays[f"{name}::error"] = np.array(f"{type(error).__name__}: {error}")
            print(f"{name}: FAILED {type(error).__name__}: {error}", flush=True)
            continue
        for key, value in flatten(kind, result).items():
            arrays[f"{name}::{key}"] = value
        print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)
    arrays["::jax_version"] = np.array(jax.__version__)
    np.savez(path, **arrays)
    print(f"{len(chosen)} cases ({len(failed)} failed: {failed}) -> {path}")
    return 0


def compare(before: str, after: str) -> int:
    a, b = np.load(before), np.load(after)
    keys_a, keys_b = set(a.files), set(b.files)
    differ = 0
    for key in sorted(keys_a - keys_b):
        print(f"only in {before}: {key}")
        differ += 1
    for key in sorted(keys_b - keys_a):
        print(f"only in {after}: {key}")
        differ += 1
    for key in sorted(keys_a & keys_b):
        x, y = a[key], b[key]
        if x.shape != y.shape or x.dtype != y.dtype:
            print(f"{key}: shape/dtype {x.shape} {x.dtype} -> {y.shape} {y.dtype}")
            differ += 1
        elif x.dtype.kind in "fc":
            if not np.array_equal(x, y, equal_nan=True):
                gap = np.nanmax(np.abs(x - y))
                print(f"{key}: differs, largest gap {gap:.3g}")
                differ += 1
        elif not np.array_equal(x, y):
            print(f"{key}: differs ({x!r} -> {y!r})" if x.ndim == 0 else f"{key}: differs")
            differ += 1
    cases_ = {k.split("::")[0] for k in keys_a | keys_b if not k.startswith("::")}
    print(f"{len(cases_)} cases, {len(keys_a & keys_b)} arrays compared: "
          f"{'all bit-identical' if differ == 0 else f'{differ} differ'}")
    return 0 if differ == 0 else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("path")
    rec.add_argument("--only", default="", help="comma-separated case names")
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("before")
    cmp_.add_argument("after")
    args = parser.parse_args(argv)
    if args.command == "record":
        return record(args.path, [c for c in args.only.split(",") if c])
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
