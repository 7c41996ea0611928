"""Run by tests/test_sharding.py in a fresh process with 8 forced CPU devices (XLA_FLAGS must be
set before jax starts). Trains a few algorithms with the clients sharded over 1 and 8 devices
and with block sizes 1, 7 and all clients, and prints JSON: per run the final model leaves,
the round metrics and how many times the round function was compiled."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np

from mcfl import engine, load_dataset, resolve
from mcfl.algorithms import on_device
from mcfl.config import RunConfig
from mcfl.models import make_model

CLIENTS = 30
ROUNDS = 3


def train(config: RunConfig, devices: int, block_size: int) -> dict:
    dataset = load_dataset(config)
    model = make_model(config.model, dataset.feature_shape, dataset.num_classes, config.hidden)
    plan = resolve(config)
    algorithm = plan.build_algorithm(model, CLIENTS, block_size)
    device = on_device(algorithm)
    hp = plan.hyperparams(model)
    init_key, rounds_key = jax.random.split(jax.random.key(config.seed))
    with jax.set_mesh(engine.client_mesh(devices)):
        assert engine.client_shards() == devices
        state = jax.jit(lambda d, k: device.init(d, k, hp))(dataset.arrays, init_key)
        round_fn = jax.jit(lambda s, d, k, r: device.round(s, d, k, hp, r))
        losses = []
        for r in range(1, ROUNDS + 1):
            state, metrics = round_fn(state, dataset.arrays, jax.random.fold_in(rounds_key, r),
                                      r)
            losses.append(float(metrics["train_loss"]))
        models = algorithm.client_models(state.algorithm, dataset.arrays).models
        lowered = round_fn.lower(state, dataset.arrays, rounds_key, 1).as_text()
    return {
        "psum_in_program": "all_reduce" in lowered or "all-reduce" in lowered,
        "leaves": [np.asarray(x, np.float64).ravel()[:200].tolist()
                   for x in jax.tree.leaves(models)],
        "losses": losses,
        "compilations": round_fn._cache_size(),
    }


def main() -> None:
    assert len(jax.devices()) == 8, jax.devices()
    out = {}
    # Every algorithm is checked on 1 vs 4 devices by the conformance suite; here the factored
    # MLP path (blocks summed on each device) with several block sizes.
    for algorithm, model in [("fedavg", "mlp")]:
        config = RunConfig(algorithm=algorithm, dataset="synthetic", clients=CLIENTS,
                           rounds=ROUNDS, model=model, hidden=(16,), local_steps=3,
                           clients_per_round=1.0,
                           **({"fesem_restarts": 2} if algorithm == "fesem" else {}))
        for devices, block in [(1, CLIENTS), (8, 1), (8, 7), (8, CLIENTS)]:
            out[f"{algorithm}/{devices}/{block}"] = train(config, devices, block)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
