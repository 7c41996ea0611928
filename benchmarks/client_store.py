"""Client state larger than memory: Local's rounds and FeSEM's start with the clients' state
on the device, in host memory or on disk (`mcfl.store`).

    python benchmarks/client_store.py local --clients 60000 --store disk --fill
    python benchmarks/client_store.py local --clients 5000 --store device
    python benchmarks/client_store.py fesem-start --clients 60000 --store disk
    python benchmarks/client_store.py local --model leaf --clients 3550 --store disk \
        --dtype bfloat16 --rows 12 --rounds 6 --fill       # FeSEM Table 1's FEMNIST stand-in
    python benchmarks/client_store.py ifca-embed --model leaf --clients 3550 --rows 12 \
        --embed 1000                  # the closing 2-D embedding of 1,000 LEAF CNNs (26 GB)

Data: Fashion-MNIST rows (Debian's dataset-fashion-mnist), `--rows` per client drawn with
replacement (8 to train, 2 to test by default), 4 planted clusters (``permuted:4``); model:
MLP 784-200-200-10 (199,210 parameters, 797 KB a client in float32). Local: 100 clients a
round, E = 5, B = 10, lr 0.05. `--fill` first writes every client's row (its model: W_0 plus
noise) so that rounds read real rows from the store, not fresh ones (an untouched client costs
no read). Prints one JSON line: per-round seconds (after the first two rounds, which compile),
the evaluation of every client, the start, and the peak resident memory (ru_maxrss).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import mcfl
from mcfl.algorithms import hyperparams
from mcfl.algorithms.framework.stored import to_storage
from mcfl.data.loaders import load_fmnist
from mcfl.runs.embedding import EmbeddingTraining, embedding_for_run
from mcfl.runs.execution import plan_run, run_keys
from mcfl.runs.program import run_program


def dataset(clients: int, rows: int, seed: int = 0):
    """`clients` clients of `rows` Fashion-MNIST rows each, in 4 planted clusters of label
    permutations (``permuted:4``, made here on the labels: `mcfl.data.plant` would copy the
    rows three times, 5.6 GB more at 60,000 clients)."""
    source = load_fmnist()
    rng = np.random.default_rng(seed)
    picked = rng.integers(0, len(source.y), clients * rows)
    owner = np.repeat(np.arange(clients), rows)
    cluster = rng.permutation(np.arange(clients) % 4)
    permutations = np.stack([np.arange(10)] + [rng.permutation(10) for _ in range(3)])
    y = permutations[cluster[owner], source.y[picked]]
    x = source.x[picked].reshape(len(picked), -1).astype(np.float32)
    x /= 255.0
    return mcfl.data.from_arrays(x, y, owner, num_classes=10, test_fraction=0.2, seed=seed,
                                 true_cluster=cluster)


def leaf_standin(clients: int, rows: int, seed: int = 0):
    """FeSEM's FEMNIST setting without LEAF's files: `clients` generated writers of `rows`
    28 x 28 grey images each (uniform noise), 62 classes."""
    rng = np.random.default_rng(seed)
    x = rng.random((clients * rows, 28, 28, 1), np.float32)
    y = rng.integers(0, 62, clients * rows)
    owner = np.repeat(np.arange(clients), rows)
    return mcfl.data.from_arrays(x, y, owner, num_classes=62, test_fraction=0.2, seed=seed)


# The workloads' models and local training: the MLP of the store's acceptance, and FeSEM
# Table 1's FEMNIST cells (experiments/fesem_table1_femnist.toml: LEAF's CNN, 6.6 M
# parameters, 20 clients a round, E = 5, B = 32, lr 0.003).
SETTINGS = {
    "mlp": dict(model="mlp", hidden=(200, 200), clients_per_round=100, local_epochs=5,
                batch_size=10, lr=0.05),
    "leaf": dict(model="cnn-leaf", clients_per_round=20, local_epochs=5, batch_size=32,
                 lr=0.003),
}


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def fill(program, state, clients: int) -> float:
    """Write every client's row (W_0 plus noise, in the storage dtype) as generation 1, 256 MB
    of float32 models at a time."""
    store, layout = program.stored.rows.store, program.stored.layout
    chunk = max(1, (1 << 28) // (4 * layout.floats()))
    start = time.perf_counter()
    template = jax.tree.map(lambda w: np.asarray(w), state)  # Local's shared state: W_0
    rng = np.random.default_rng(1)
    for lo in range(0, clients, chunk):
        hi = min(lo + chunk, clients)
        count = hi - lo
        rows = jax.tree.map(lambda w, count=count: (w[None] + 0.01 * rng.standard_normal(
            (count,) + w.shape, np.float32)), template)
        rows = jax.device_get(to_storage(jax.tree.map(jnp.asarray, rows),
                                         program.algorithm.client_state.dtype))
        store.scatter(np.arange(lo, hi)[None], layout.pack(rows)[None], 1)
    return time.perf_counter() - start


def prepared(config, args):
    """The workload's clients, and the program of `config` with its store in an emptied
    `args.folder`: (dataset, program, the store chosen)."""
    data = (dataset if args.model == "mlp" else leaf_standin)(args.clients, args.rows)
    folder = Path(args.folder)
    shutil.rmtree(args.folder, ignore_errors=True)
    folder.mkdir(parents=True)
    program, choice = run_program(config, plan_run(config, data), data.arrays, folder)
    return data, program, choice


def local(args) -> dict:
    config = mcfl.RunConfig(algorithm="local", **SETTINGS[args.model], clients=args.clients,
                            rounds=args.rounds, eval_every=args.rounds, client_store=args.store,
                            client_store_dtype=args.dtype, seed=0)
    data, program, choice = prepared(config, args)
    init_key, rounds_key = run_keys(config.seed)
    program.compile_init({}, init_key, data.arrays)
    state = program.init({}, init_key, data.arrays)
    program.compile_rounds({}, state, rounds_key, data.arrays)
    out = {"workload": "local", "model": args.model, "clients": args.clients,
           "store": choice.kind,
           "dtype": args.dtype, "stored_gib": choice.stored_bytes / 2**30}
    if args.fill and choice.kind != "device":
        out["fill_seconds"] = fill(program, state, args.clients)
    seconds = []
    for r in range(1, args.rounds + 1):
        t0 = time.perf_counter()
        state, metrics = program.rounds(1, {}, state, data.arrays, rounds_key, r)
        jax.block_until_ready(state)
        seconds.append(time.perf_counter() - t0)
    if choice.kind != "device":
        program.wait_writes()
    t0 = time.perf_counter()
    counts, test_counts, _ = program.evaluate({}, state, data.arrays)
    out["evaluate_seconds"] = time.perf_counter() - t0
    out["accuracy"] = float(np.sum(counts.correct) / np.sum(test_counts))
    steady = seconds[2:]
    out.update(round_seconds_median=statistics.median(steady),
               round_seconds_mean=statistics.fmean(steady), rounds_timed=len(steady),
               train_loss_last=float(np.asarray(metrics["train_loss"]).ravel()[-1]),
               peak_rss_gib=peak_gib())
    program.close()
    if not args.keep:
        shutil.rmtree(args.folder, ignore_errors=True)
    return out


def fesem_start(args) -> dict:
    from sklearn.metrics import adjusted_rand_score

    config = mcfl.RunConfig(algorithm="fesem", **SETTINGS[args.model], clients=args.clients,
                            rounds=1,
                            clusters=4, fesem_restarts=args.restarts, client_store=args.store,
                            client_store_dtype=args.dtype, seed=0)
    data, program, choice = prepared(config, args)
    init_key, _ = run_keys(config.seed)
    program.compile_init({}, init_key, data.arrays)
    t0 = time.perf_counter()
    state = program.init({}, init_key, data.arrays)
    jax.block_until_ready(state)
    seconds = time.perf_counter() - t0
    labels = np.asarray(state.assignment)
    out = {"workload": "fesem-start", "model": args.model, "clients": args.clients,
           "store": choice.kind, "dtype": args.dtype,
           "restarts": args.restarts, "stored_gib": choice.stored_bytes / 2**30,
           "start_seconds": seconds,
           "ari": (adjusted_rand_score(data.true_cluster, labels)
                   if data.true_cluster is not None else None),
           "sizes": np.bincount(labels, minlength=4).tolist(), "peak_rss_gib": peak_gib()}
    if args.embed:
        out.update(embed(args, config, program, choice.kind, state, data))
    program.close()
    shutil.rmtree(args.folder, ignore_errors=True)
    return out


def ifca_embed(args) -> dict:
    """IFCA (which keeps nothing per client: a device-store run) initialised on the clients,
    then its closing embedding of `args.embed` clients: on the LEAF CNN, 1,000 clients' models
    are 26 GB, which the one-program path would hold three times."""
    config = mcfl.RunConfig(algorithm="ifca", **SETTINGS[args.model], clients=args.clients,
                            rounds=1, clusters=4, client_store=args.store, seed=0)
    data, program, choice = prepared(config, args)
    init_key, _ = run_keys(config.seed)
    program.compile_init({}, init_key, data.arrays)
    state = program.init({}, init_key, data.arrays)
    jax.block_until_ready(state)
    out = {"workload": "ifca-embed", "model": args.model, "clients": args.clients,
           "store": choice.kind, **embed(args, config, program, choice.kind, state, data)}
    program.close()
    shutil.rmtree(args.folder, ignore_errors=True)
    return out


def embed(args, config, program, store_kind: str, state, data) -> dict:
    """The run's closing 2-D embedding of `args.embed` clients (`mcfl.runs.embedding`), timed."""
    training = hyperparams(config, program.plan.model).training
    before = peak_gib()
    t0 = time.perf_counter()
    found, where = embedding_for_run(
        EmbeddingTraining(program.algorithm, training, program.run_plan.train_block),
        args.embed, program.run_plan.params_count, store_kind,
        None if program.stored is None else program.stored.folder,
        program.algorithm_state(state), data.arrays, jax.random.key(1))
    jax.block_until_ready(found)
    return {"embed_clients": args.embed, "embed_models_gib":
            4 * args.embed * program.run_plan.params_count / 2**30, "embed_through": where,
            "embed_seconds": time.perf_counter() - t0,
            "embed_explained": np.asarray(found.explained).tolist(),
            "peak_rss_gib_before_embed": before, "peak_rss_gib_after_embed": peak_gib()}


WORKLOADS = {"local": local, "fesem-start": fesem_start, "ifca-embed": ifca_embed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=tuple(WORKLOADS))
    parser.add_argument("--model", choices=tuple(SETTINGS), default="mlp",
                        help="mlp: 784-200-200-10 on Fashion-MNIST rows; leaf: LEAF's FEMNIST "
                        "CNN on generated writers")
    parser.add_argument("--clients", type=int, default=60_000)
    parser.add_argument("--rows", type=int, default=10, help="rows a client (train + test)")
    parser.add_argument("--store", default="auto", choices=("auto", "device", "host", "disk"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--restarts", type=int, default=20)
    parser.add_argument("--fill", action="store_true")
    parser.add_argument("--embed", type=int, default=0,
                        help="fesem-start: then the closing 2-D embedding of this many clients; "
                        "ifca-embed: how many")
    parser.add_argument("--keep", action="store_true", help="keep the store's folder")
    parser.add_argument("--folder", default="/tmp/mcfl-store-bench")
    args = parser.parse_args()
    result = WORKLOADS[args.workload](args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
