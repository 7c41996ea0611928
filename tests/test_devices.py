"""Checks that need several devices: for every registered algorithm, 1 and 4 devices agree and
its programs lower for TPU and CUDA on one device and dealt over 4 (`mcfl.planning.lowering`);
a sweep's members dealt over 4 devices equal one device's. Their runs take a process of their
own with 4 forced CPU devices (tests/conformance_background.py), started with the test
session so that its compiling overlaps the other tests; this file runs last
(tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conformance_setup import (
    ZOO,
    build_small,
    one_device_file,
    one_device_summary,
    planted_data,
    rounds_run,
    write_json,
)

from mcfl.algorithms import names

# The default run's algorithms over 4 devices, one of each way a round is built: plain
# averaging, k-means clusters, loss argmin, groups, splits, mixtures, personal rows, soft
# clusters with rows, one-shot clustering, local models. The rest: -m slow.
DEFAULT_ALGORITHMS = ("fedavg", "fesem", "ifca", "flexcfl", "cfl", "fedem", "ditto", "fedsoft",
                      "pacfl", "local")
ALGORITHMS = [pytest.param(name, marks=() if name in DEFAULT_ALGORITHMS else pytest.mark.slow)
              for name in names()]


def one_device(name: str, shared: Path) -> dict:
    """The one-device run tests/test_conformance.py left (the same keys as the background's
    four-device run), or, when this session did not run it (a selection), that run here."""
    path = one_device_file(shared, name)
    if not path.exists():
        algorithm, data = build_small(name), planted_data().arrays
        _, state, rows, _, rounds_key = rounds_run(algorithm, data)
        write_json(path, one_device_summary(name, algorithm, state, rows, data, rounds_key))
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", ALGORITHMS)
def test_one_and_four_devices_agree(name, conformance_background, shared):
    one, four = one_device(name, shared), conformance_background()[f"{name}/devices/4"]
    np.testing.assert_allclose(four["losses"], one["losses"], rtol=1e-4, atol=1e-6)
    for a, b in zip(four["leaves"], one["leaves"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_programs_lower_for_tpu_and_cuda(name, conformance_background, shared):
    """Init and round with the clients dealt over 4 devices, the round on one."""
    assert conformance_background()[f"{name}/devices/4"]["lowered"] == {"init": "ok",
                                                                       "round": "ok"}
    assert one_device(name, shared)["lowered"] == {"round": "ok"}


@pytest.mark.parametrize("model_name", ZOO)
def test_zoo_models_lower_for_tpu_and_cuda_over_four_devices(model_name, conformance_background):
    """FedAvg's init and round on each zoo model, clients dealt over 4 devices (one device:
    tests/test_zoo_conformance.py)."""
    assert conformance_background()[f"zoo/{model_name}/devices/4"] == {"init": "ok",
                                                                      "round": "ok"}


def test_members_dealt_over_four_devices_equal_one_device(conformance_background):
    """A FeSEM sweep (lambda x 2 seeds) with its members dealt over 4 CPU devices gives the
    rows of the same sweep on one (tests/conformance_background.py, run in the background)."""
    results = conformance_background()
    one, four = results["sweep/devices/1"], results["sweep/devices/4"]
    assert len(one["train_loss"]) == 12
    np.testing.assert_allclose(four["train_loss"], one["train_loss"], rtol=1e-5)
    np.testing.assert_allclose(four["accuracy"], one["accuracy"], rtol=1e-6)
