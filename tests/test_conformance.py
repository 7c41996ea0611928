"""Checks every registered algorithm passes, looped over the registry, so that a new algorithm
is checked without new test code: its round compiles once, `scan_rounds` equals round by round,
its metrics and models are well formed, and bad hyperparameters are config errors. The
checks of 1 against 4 devices and of every distribution shift are in tests/test_devices.py
(a process of their own)."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conformance_setup import (
    SETTINGS,
    build_small,
    one_device_file,
    one_device_summary,
    planted_data,
    rounds_run,
    scan,
    write_json,
)

import mcfl
from mcfl import settings
from mcfl.algorithms import get, names
from mcfl.errors import ConfigError

REQUIRED_METRICS = {"train_loss", "discrepancy", "local_steps", "models_down", "models_up"}


@pytest.fixture(scope="module")
def data():
    return planted_data()


_RUNS: dict = {}


def _run(name, data, shared=None):
    """Round by round with a trace counter, then the same rounds as one scan. The round-by-round
    result and its round lowered for TPU and CUDA go to `shared` for tests/test_devices.py
    (which compares them with four devices), when given."""
    if name in _RUNS:
        return _RUNS[name]
    algorithm = build_small(name)
    chex.clear_trace_counter()  # algorithms built by one factory share round code
    state0, state, rows, _, rounds_key = rounds_run(
        algorithm, data.arrays, jax.jit(chex.assert_max_traces(algorithm.round, n=1)))
    if shared is not None:
        write_json(one_device_file(shared, name), one_device_summary(
            name, algorithm, state, rows, data.arrays, rounds_key))
    scanned, stacked = scan(algorithm, state0, data.arrays, rounds_key, 1, SETTINGS["rounds"])
    _RUNS[name] = algorithm, state, rows, scanned, jax.device_get(stacked)
    return _RUNS[name]


@pytest.fixture
def for_devices(request, name, shared):
    """`shared` for the algorithms tests/test_devices.py compares in this session (its default
    few, or all with -m slow: tests/conftest.py), else None: the others' one-device lowering
    would be read by no test."""
    return shared if name in getattr(request.config, "background_algorithms", ()) else None


@pytest.mark.parametrize("name", names())
def test_compiles_once_and_scan_equals_round_by_round(name, data, for_devices):
    _, state, rows, scanned, stacked = _run(name, data, for_devices)
    chex.assert_trees_all_close(scanned, state, atol=1e-5, rtol=1e-5)
    for key in rows[0]:
        np.testing.assert_allclose(stacked[key], [row[key] for row in rows], rtol=1e-5,
                                   atol=1e-6, err_msg=key)


@pytest.mark.parametrize("name", names())
def test_metrics_models_and_assignments_are_well_formed(name, data, for_devices):
    algorithm, state, rows, _, _ = _run(name, data, for_devices)
    required = REQUIRED_METRICS | ({"num_clusters"} if get(name).clustered else set())
    for row in rows:
        assert required <= set(row), required - set(row)
        assert all(np.ndim(v) == 0 and np.isfinite(v) for v in row.values()), row
        assert row["train_loss"] > 0 and row["models_up"] >= 0
    models, index = algorithm.client_models(state)
    num_models = jax.tree.leaves(models)[0].shape[0]
    if index is not None:
        assert index.shape == (SETTINGS["clients"],)
        assert 0 <= int(jnp.min(index)) and int(jnp.max(index)) < num_models
    if algorithm.assignments is not None:
        assigned = np.asarray(algorithm.assignments(state))
        assert assigned.shape == (SETTINGS["clients"],)
        assert assigned.min() >= -1 and assigned.max() < SETTINGS["clusters"]  # -1: ungrouped


def _bad_values(cls, field) -> list:
    """Values of the wrong type, non-finite or outside the allowed range for `field`."""
    hint = settings.type_of(cls, field)
    meta = field.metadata
    if hint is bool:
        return ["false", 1]
    if hint is str:
        return [3] + (["not-a-choice"] if meta.get("choices") else [])
    bad = ["1", True, float("nan")]
    if hint is int:
        bad.append(1.5)
    for bound, step in (("minimum", -1), ("above", 0), ("maximum", 1), ("below", 0)):
        if meta.get(bound) is not None:
            bad.append(meta[bound] + step)
    return bad


@pytest.mark.parametrize("name", names())
def test_bad_hyperparameters_are_config_errors(name):
    cls = get(name).params
    for field in dataclasses.fields(cls):
        key = settings.key_of(field)
        for value in _bad_values(cls, field):
            with pytest.raises(ConfigError, match=key):
                mcfl.RunConfig(algorithm=name, clients=200, **{key: value})
