"""Run by tests/test_conformance.py in a fresh process with 4 forced CPU devices (XLA_FLAGS is
read when jax starts): every registered algorithm, 2 rounds on one device and with the clients
dealt over 4; prints JSON: per algorithm and device count, the round losses and the first
values of every model leaf."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
from conformance_setup import SETTINGS, build_small, planted_data  # noqa: I001

from mcfl import engine
from mcfl.algorithms import names


def main() -> None:
    assert len(jax.devices()) == 4, jax.devices()
    data = planted_data()
    out = {}
    for name in names():
        for devices in (1, 4):
            algorithm = build_small(name)
            init_key, rounds_key = jax.random.split(jax.random.key(0))
            mesh = engine.client_mesh(devices)
            with jax.set_mesh(mesh):
                state = jax.jit(algorithm.init)(data.arrays, init_key)
                step = jax.jit(algorithm.round)
                losses = []
                for r in range(1, SETTINGS["rounds"] + 1):
                    state, metrics = step(state, data.arrays, jax.random.fold_in(rounds_key, r))
                    losses.append(float(metrics["train_loss"]))
                models, _ = algorithm.client_models(state)
            out[f"{name}/{devices}"] = {
                "losses": losses,
                "leaves": [np.asarray(x, np.float64).ravel()[:64].tolist()
                           for x in jax.tree.leaves(models)],
            }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
