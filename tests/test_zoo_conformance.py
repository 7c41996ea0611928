"""Every registered algorithm on every model of the zoo (at tiny sizes), as
tests/test_conformance.py checks them on MCLR: the round compiles once, `scan_rounds` equals
round by round, and the metrics are finite. The algorithms' code never names a model, so
what this checks is that each model's parameter tree, train mode and fast paths go through
every algorithm's round (clustering, matching, gradients, per-client state).

The whole product (14 algorithms x 5 models) is mostly compiling (its cases beyond the
default took 8 min 34 s in one process on a 2-core EPYC), too much for the suite's budget,
so the default run (and CI) checks FedAvg (one global model) on every model, IFCA (K models
chosen by loss) on every model but the ResNet (the costliest to compile, 30 s a case), and
Local (a model per client) on the LSTM; ``pytest -m zoo_full tests/test_zoo_conformance.py``
runs the rest. Each case's initialisation and round are also lowered for TPU and CUDA on one
device (`mcfl.planning.lowering`); tests/test_devices.py lowers FedAvg on every zoo model with the
clients dealt over four."""

from __future__ import annotations

import chex
import jax
import numpy as np
import pytest
from conformance_setup import SETTINGS, ZOO, lowered, scan, small_params, zoo_data
from conftest import algorithm

from mcfl.algorithms import get, names
from mcfl.engine import FastPaths, LocalTraining
from mcfl.errors import ConfigError
from mcfl.models import make_model

PER_ROUND, ROUNDS = 4, 2
# gradient-stepping algorithms refuse a model with batch statistics (a one-line error)
REFUSED = {("fedsgd", "cnn-cifar-bn"), ("feddane", "cnn-cifar-bn"), ("cflgp", "cnn-cifar-bn")}


# (model, algorithm) pairs of the default run; the others are marked zoo_full
# (ResNet-18 only under zoo_full: its tiny form's programs are the default run's largest, and
# tests/test_zoo.py checks its layers)
DEFAULT_CASES = ({(m, "fedavg") for m in ZOO if m != "resnet18-gn"}
                 | {(m, "ifca") for m in ZOO if m != "resnet18-gn"}
                 | {("char-lstm", "local")})


def _cases():
    for model_name in ZOO:
        for name in names():
            marks = () if (model_name, name) in DEFAULT_CASES else (pytest.mark.zoo_full,)
            yield pytest.param(model_name, name, marks=marks, id=f"{model_name}-{name}")


@pytest.fixture(scope="module")
def zoo_models():
    """Each zoo model's spec and data, built once for the module."""
    built = {}

    def get_model(name):
        if name not in built:
            shape, classes, args = ZOO[name]
            built[name] = (make_model(name, shape, classes, model_args=args),
                           zoo_data(shape, classes))
        return built[name]

    return get_model


@pytest.mark.parametrize("model_name,algorithm_name", list(_cases()))
def test_every_algorithm_on_every_zoo_model(model_name, algorithm_name, zoo_models):
    model, data = zoo_models(model_name)
    training = LocalTraining(model.apply, batch_size=4, lr=0.05, local_steps=2,
                             fast=FastPaths(model.dense_layers, model.factored),
                             train_apply=model.train_apply, collections=model.collections)
    clusters = 2 if get(algorithm_name).clustered else 1
    params = {**small_params(algorithm_name), **({"fesem_restarts": 1}
                                                  if algorithm_name.startswith("fesem") else {})}
    if (algorithm_name, model_name) in REFUSED:
        with pytest.raises(ConfigError, match="gradients"):
            algorithm(algorithm_name, model, training, PER_ROUND, SETTINGS["block"], clusters,
                      **params)
        return
    bound = algorithm(algorithm_name, model, training, PER_ROUND, 2, clusters, **params)
    init_key, rounds_key = jax.random.split(jax.random.key(0))
    state0 = jax.jit(bound.init)(data, init_key)
    chex.clear_trace_counter()
    step = jax.jit(chex.assert_max_traces(bound.round, n=1))
    state, rows = state0, []
    for r in range(1, ROUNDS + 1):
        state, metrics = step(state, data, jax.random.fold_in(rounds_key, r))
        rows.append(jax.device_get(metrics))
    for row in rows:
        assert all(np.isfinite(v) for v in row.values()), row
    # The model's programs lowered for TPU and CUDA (mcfl.planning.lowering), on one device.
    assert lowered(f"{algorithm_name} on {model_name}", {
        "init": (bound.init, (data, init_key)),
        "round": (bound.round, (state, data, rounds_key))}) == {"init": "ok", "round": "ok"}
    scanned, stacked = scan(bound, state0, data, rounds_key, 1, ROUNDS)
    chex.assert_trees_all_close(scanned, state, atol=1e-5, rtol=1e-5)
    for key in rows[0]:
        np.testing.assert_allclose(jax.device_get(stacked[key]), [row[key] for row in rows],
                                   rtol=1e-5, atol=1e-6, err_msg=key)
