"""The small problem every registered algorithm is checked on (tests/test_conformance.py and its
multi-device subprocess): 40 clients of 12-feature Gaussian data, 3 classes each (so that
swap_part has labels to trade), with 4 planted label permutations; MCLR, 8 clients a round,
2 local steps, K = 3. The algorithms that keep some layers per client (FedPer, LG-FedAvg,
FedRep) need two layers: an MLP 12-8-10 for them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mcfl import settings
from mcfl.algorithms import get
from mcfl.engine import FastPaths, LocalTraining
from mcfl.models import make_model

SETTINGS = {"clients": 40, "per_round": 8, "block": 4, "clusters": 3, "rounds": 3}
# Hyperparameters scaled to the small problem, for the algorithms that take them.
SMALL = {"pretrain_scale": 2, "cfl_warmup": 1, "fesem_restarts": 2}
# The model each algorithm is checked with, when not MCLR: hidden layer sizes.
LAYERED = {"fedper": (8,), "lg_fedavg": (8,), "fedrep": (8,)}


def planted_data():
    from conftest import planted_gaussian

    return planted_gaussian(SETTINGS["clients"], labels="shards:3")


def small_params(name: str) -> dict:
    takes = settings.fields_of(get(name).params)
    return {k: v for k, v in SMALL.items() if k in takes}


def build_small(name: str, backend=None):
    """The algorithm `name` on the small problem, bound to its hyperparameters
    (`conftest.Bound`: ``.algorithm``, ``.hp``); its model built for `backend` (default: this
    machine's)."""
    from conftest import algorithm

    model = (make_model("mlp", (12,), 10, hidden=LAYERED[name], backend=backend)
             if name in LAYERED else make_model("mclr", (12,), 10, backend=backend))
    training = LocalTraining(model.apply, batch_size=10, lr=0.05, local_steps=2,
                             fast=FastPaths(model.dense_layers))
    clusters = SETTINGS["clusters"] if get(name).clustered else 1
    return algorithm(name, model, training, SETTINGS["per_round"], SETTINGS["block"], clusters,
                     **small_params(name))


def scan(bound, state, data, rounds_key, first: int, count: int):
    """`scan_rounds` of a bound algorithm (`conftest.Bound`): (final state, stacked metrics)."""
    import functools

    import jax

    from mcfl.algorithms.framework.device import scan_rounds

    run = jax.jit(functools.partial(scan_rounds, bound.device, bound.hp), static_argnums=(4,))
    final, stacked = run(bound.device_state(state), data, rounds_key, first, count)
    return (final if bound.rows or bound.transform.acts else final.algorithm), stacked


def run_summary(algorithm, state, losses: list) -> dict:
    """What 1 and 4 devices are compared on (tests/test_devices.py): the round losses and the
    first values of every leaf of the client models."""
    import jax
    import numpy as np

    models, _ = algorithm.client_models(state)
    return {"losses": [float(x) for x in losses],
            "leaves": [np.asarray(x, np.float64).ravel()[:64].tolist()
                       for x in jax.tree.leaves(models)]}


def lowered(name: str, programs: dict) -> dict:
    """Each of `programs` ({label: (function, args)}) lowered for TPU and CUDA
    (`mcfl.planning.lowering`): "ok" or the reason it does not lower."""
    from mcfl.planning.lowering import LoweringError, lower_for

    out = {}
    for label, (fn, args) in programs.items():
        try:
            lower_for(fn, *args, name=f"{name} {label}")
            out[label] = "ok"
        except LoweringError as error:
            out[label] = str(error)
    return out


def rounds_run(algorithm, data, step=None):
    """`algorithm` initialised and run SETTINGS["rounds"] rounds on `data` (its arrays) with
    the keys every conformance and device check uses, round by round through `step` (default:
    the jitted round): (initial state, final state, each round's metrics on the host,
    init key, rounds key)."""
    import jax

    init_key, rounds_key = jax.random.split(jax.random.key(0))
    state0 = jax.jit(algorithm.init)(data, init_key)
    step = step or jax.jit(algorithm.round)
    state, rows = state0, []
    for r in range(1, SETTINGS["rounds"] + 1):
        state, metrics = step(state, data, jax.random.fold_in(rounds_key, r), r)
        rows.append(jax.device_get(metrics))
    return state0, state, rows, init_key, rounds_key


def one_device_summary(name: str, algorithm, state, rows, data, rounds_key) -> dict:
    """`run_summary` of a one-device run, with its round lowered for TPU and CUDA."""
    summary = run_summary(algorithm, state, [row["train_loss"] for row in rows])
    summary["lowered"] = lowered(name, {"round": (algorithm.round, (state, data, rounds_key))})
    return summary


def one_device_file(shared: Path, name: str) -> Path:
    """Where tests/test_conformance.py leaves its one-device run of `name` for
    tests/test_devices.py (the same keys as the background's four-device run)."""
    return shared / f"one-device-{name}.json"


def write_json(path: Path, document) -> None:
    """`document` to `path` whole (a reader never sees half)."""
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(json.dumps(document))
    partial.replace(path)


# model name -> (feature shape, classes, model_args): tiny versions of the zoo's models
ZOO = {
    "cnn-cifar": ((8, 8, 3), 10, {}),
    "cnn-cifar-bn": ((8, 8, 3), 10, {}),
    "resnet18-gn": ((8, 8, 3), 10, {"width": 4, "groups": 2}),
    "char-lstm": ((6,), 80, {"units": 8, "embed": 4}),
    "transformer-char": ((6,), 80, {"width": 8, "heads": 2, "layers": 1}),
}
ZOO_CLIENTS = 8


def zoo_data(feature_shape, classes):
    """ZOO_CLIENTS clients of 6 (or 9) train and 2 test rows of random features (images in
    [0, 1], or character indices), labels in 4 planted label maps (the arrays)."""
    import numpy as np

    from mcfl.data.federated import from_splits

    rng = np.random.default_rng(0)

    def rows(per_client):
        owner = np.repeat(np.arange(ZOO_CLIENTS), per_client)
        if len(feature_shape) == 1:
            x = rng.integers(0, 80, (owner.size,) + feature_shape).astype(np.float32)
        else:
            x = rng.uniform(0, 1, (owner.size,) + feature_shape).astype(np.float32)
        return x, rng.integers(0, classes, owner.size), owner

    sizes = np.where(np.arange(ZOO_CLIENTS) % 2 == 0, 6, 9)
    return from_splits("tiny", rows(sizes), rows(np.full(ZOO_CLIENTS, 2)), ZOO_CLIENTS,
                       classes, true_cluster=np.arange(ZOO_CLIENTS) % 4).arrays


def zoo_fedavg(model_name: str, clients_per_round: int = 4, backend=None):
    """FedAvg on the tiny version of a zoo model, and its data: (`conftest.Bound`, arrays);
    the model built for `backend` (default: this machine's)."""
    return fedavg_on(model_name, *ZOO[model_name], clients_per_round, backend)


def fedavg_on(model_name: str, shape, classes: int, args: dict, clients_per_round: int = 4,
              backend=None):
    """FedAvg on a registered model built for `shape` and `classes` with `args`, and random
    data for it (`zoo_data`): (`conftest.Bound`, arrays)."""
    from conftest import algorithm

    model = make_model(model_name, shape, classes, model_args=args, backend=backend)
    training = LocalTraining(model.apply, batch_size=4, lr=0.05, local_steps=2,
                             fast=FastPaths(model.dense_layers, model.factored),
                             train_apply=model.train_apply, collections=model.collections)
    return (algorithm("fedavg", model, training, clients_per_round, 2),
            zoo_data(shape, classes))
