"""Run by the test session in the background (tests/conftest.py starts it at once; compilation
is mostly one core's work, so it overlaps with the other tests) with 4 forced CPU devices:
every registered algorithm the session's tests name (tests/test_devices.py: a representative
few by default, all with -m slow) 3 rounds with the clients dealt over 4, and its programs (init,
round) lowered for TPU and CUDA in that layout (the same 3 rounds on one device, with their
round lowered, come from tests/test_conformance.py, which runs them anyway); a sweep (members
vmapped) on one device and over 4; FedAvg's init and round on every zoo model lowered over 4.
Writes its results as JSON to the file named by its first argument (through a temporary file,
so a reader never sees half), or the error to the file named by its second, for
tests/test_devices.py."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import jax
from conformance_setup import (  # noqa: I001
    ZOO,
    build_small,
    lowered,
    planted_data,
    rounds_run,
    run_summary,
    zoo_fedavg,
)

import mcfl
from mcfl import engine
from mcfl.algorithms import names


def devices_run(name: str, data, devices: int) -> dict:
    algorithm = build_small(name)
    with jax.set_mesh(engine.client_mesh(devices)):
        _, state, rows, init_key, rounds_key = rounds_run(algorithm, data.arrays)
        summary = run_summary(algorithm, state, [row["train_loss"] for row in rows])
        # The programs as this layout holds their arrays, lowered for TPU and CUDA.
        summary["lowered"] = lowered(name, {
            "init": (algorithm.init, (data.arrays, init_key)),
            "round": (algorithm.round, (state, data.arrays, rounds_key))})
    return summary


def zoo_lowered(model_name: str, devices: int) -> dict:
    """FedAvg on a zoo model, its clients dealt over `devices` inside its programs (its state,
    one global model, and the data are replicated: shapes stand for them), init and round
    lowered for TPU and CUDA; nothing is compiled."""
    bound, data = zoo_fedavg(model_name)
    with jax.set_mesh(engine.client_mesh(devices)):
        init_key, rounds_key = jax.random.split(jax.random.key(0))
        state = jax.eval_shape(bound.init, data, init_key)
        return lowered(f"fedavg on {model_name}", {
            "init": (bound.init, (data, init_key)),
            "round": (bound.round, (state, data, rounds_key))})


def sweep_run(devices: int) -> dict:
    """FeSEM's lambda x 2 seeds as one sweep, its clients over `devices` devices."""
    config = mcfl.RunConfig(algorithm="fesem", clusters=2, clients=12, clients_per_round=4,
                            rounds=3, eval_every=3, embed_clients=0, devices=devices)
    result = mcfl.sweep(config, seeds=[0, 1], grid={"fesem_lambda": [0.0, 0.1]})
    return {"train_loss": [r["train_loss"] for r in result.rounds],
            "accuracy": [m["final_accuracy_micro"] for m in result.members]}


def main(algorithms: list[str]) -> dict:
    assert len(jax.devices()) == 4, jax.devices()
    data = planted_data()
    out = {}
    for name in algorithms:  # (their one-device runs: tests/test_conformance.py)
        out[f"{name}/devices/4"] = devices_run(name, data, 4)
    for devices in (1, 4):
        out[f"sweep/devices/{devices}"] = sweep_run(devices)
    for model_name in ZOO:
        out[f"zoo/{model_name}/devices/4"] = zoo_lowered(model_name, 4)
    return out


if __name__ == "__main__":
    results_file, error_file = (Path(a) for a in sys.argv[1:3])
    # the algorithms the session's tests ask for (tests/conftest.py), else every one
    chosen = ([a for a in sys.argv[3].split(",") if a] if len(sys.argv) > 3
              else list(names()))
    try:
        found = main(chosen)
    except BaseException:  # noqa: BLE001 - reported to the tests through the error file
        error_file.write_text(traceback.format_exc())
        raise
    partial = results_file.with_suffix(".partial")
    partial.write_text(json.dumps(found))
    partial.replace(results_file)
