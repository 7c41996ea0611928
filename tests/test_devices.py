"""Checks that need several devices: for every registered algorithm, 1 and 4 devices agree;
a sweep's members dealt over 4 devices equal one device's. Their runs take a process of their
own with 4 forced CPU devices (tests/conformance_background.py), started with the test
session so that its compiling overlaps the other tests; this file runs last
(tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

from mcfl.algorithms import names


@pytest.mark.parametrize("name", names())
def test_one_and_four_devices_agree(name, conformance_background):
    results = conformance_background()
    one, four = results[f"{name}/devices/1"], results[f"{name}/devices/4"]
    np.testing.assert_allclose(four["losses"], one["losses"], rtol=1e-4, atol=1e-6)
    for a, b in zip(four["leaves"], one["leaves"]):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


def test_members_dealt_over_four_devices_equal_one_device(conformance_background):
    """A FeSEM sweep (lambda x 2 seeds) with its members dealt over 4 CPU devices gives the
    rows of the same sweep on one (tests/conformance_background.py, run in the background)."""
    results = conformance_background()
    one, four = results["sweep/devices/1"], results["sweep/devices/4"]
    assert len(one["train_loss"]) == 12
    np.testing.assert_allclose(four["train_loss"], one["train_loss"], rtol=1e-5)
    np.testing.assert_allclose(four["accuracy"], one["accuracy"], rtol=1e-6)
