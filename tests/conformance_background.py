"""Run by the test session in the background (tests/conftest.py starts it at once; compilation
is mostly one core's work, so it overlaps with the other tests) with 4 forced CPU devices:
every registered algorithm 3 rounds on one device and with the clients dealt over 4, and 2
rounds under each distribution shift; a sweep (members vmapped) on one device and over 4.
Prints JSON for tests/test_conformance.py and tests/test_sweeps.py."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
from conformance_setup import SETTINGS, build_small, planted_data, scan  # noqa: I001
from conftest import Bound

import mcfl
from mcfl import engine
from mcfl.algorithms import names
from mcfl.shift import with_shift

SHIFTS = ("swap_all", "swap_part", "incremental")


def devices_run(name: str, data, devices: int) -> dict:
    algorithm = build_small(name)
    init_key, rounds_key = jax.random.split(jax.random.key(0))
    with jax.set_mesh(engine.client_mesh(devices)):
        state = jax.jit(algorithm.init)(data.arrays, init_key)
        step = jax.jit(algorithm.round)
        losses = []
        for r in range(1, SETTINGS["rounds"] + 1):
            state, metrics = step(state, data.arrays, jax.random.fold_in(rounds_key, r))
            losses.append(float(metrics["train_loss"]))
        models, _ = algorithm.client_models(state)
    return {"losses": losses,
            "leaves": [np.asarray(x, np.float64).ravel()[:64].tolist()
                       for x in jax.tree.leaves(models)]}


def shift_run(name: str, data, kind: str) -> dict:
    small = build_small(name)
    shifted = Bound(with_shift(small.algorithm, kind, interval=1),
                    small.hp.replace(shift_prob=1.0), small.block_size)
    state = jax.jit(shifted.init)(data.arrays, jax.random.key(1))
    _, stacked = scan(shifted, state, data.arrays, jax.random.key(2), 1, 2)
    return {"losses": np.asarray(stacked["train_loss"]).tolist(),
            "shifted_rows": np.asarray(stacked["shifted_rows"]).tolist()}


def sweep_run(devices: int) -> dict:
    """FeSEM's lambda x 2 seeds as one sweep, its clients over `devices` devices."""
    config = mcfl.RunConfig(algorithm="fesem", clusters=2, clients=12, clients_per_round=4,
                            rounds=3, eval_every=3, embed_clients=0, devices=devices)
    result = mcfl.sweep(config, seeds=[0, 1], grid={"fesem_lambda": [0.0, 0.1]})
    return {"train_loss": [r["train_loss"] for r in result.rounds],
            "accuracy": [m["final_accuracy_micro"] for m in result.members]}


def main() -> None:
    assert len(jax.devices()) == 4, jax.devices()
    data = planted_data()
    out = {}
    for name in names():
        for devices in (1, 4):
            out[f"{name}/devices/{devices}"] = devices_run(name, data, devices)
        for kind in SHIFTS:
            out[f"{name}/shift/{kind}"] = shift_run(name, data, kind)
    for devices in (1, 4):
        out[f"sweep/devices/{devices}"] = sweep_run(devices)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
