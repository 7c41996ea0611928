"""Checks every algorithm passes, looped over all of them (so a new one is checked without new
test code)."""

from __future__ import annotations

import chex
import jax
import numpy as np
import pytest
from conftest import planted_gaussian

from mcfl.algorithms import build_algorithm, names
from mcfl.config import RunConfig
from mcfl.models import make_model


@pytest.fixture(scope="module")
def planted():
    return planted_gaussian(40)


@pytest.mark.parametrize("name", names())
def test_rounds_compile_once(planted, name):
    """Round 1 traces the round; later rounds, with other clients sampled (newcomers, splits,
    emptied clusters), reuse the program."""
    chex.clear_trace_counter()  # fedavg / fedprox and fedgroup / flexcfl share round code
    extra = {"fedgroup": {"pretrain_scale": 2}, "flexcfl": {"pretrain_scale": 2},
             "cfl": {"cfl_warmup": 1}}.get(name, {})
    config = RunConfig(algorithm=name, clients=40, clusters=3, clients_per_round=8,
                       local_steps=2, lr=0.05, **extra)
    model = make_model("mclr", (12,), 10)
    algorithm = build_algorithm(config, model, 8, 4)
    state = jax.jit(algorithm.init)(planted.arrays, jax.random.key(0))
    step = jax.jit(chex.assert_max_traces(algorithm.round, n=1))
    for r in range(3):
        state, metrics = step(state, planted.arrays, jax.random.key(r))
        assert np.isfinite(float(metrics["train_loss"]))
