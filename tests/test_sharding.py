"""Sharding the clients over 8 (forced CPU) devices changes nothing but the schedule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import xla_flags_with_devices

from mcfl.engine import client_mesh

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def sharded_runs():
    env = {**os.environ, "XLA_FLAGS": xla_flags_with_devices(8),
           "PYTHONPATH": str(HERE.parent)}
    done = subprocess.run([sys.executable, str(HERE / "sharding_check.py")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("algorithm", ["fedavg"])
def test_one_and_eight_devices_and_any_block_size_agree(sharded_runs, algorithm):
    reference = sharded_runs[f"{algorithm}/1/30"]
    assert not reference["psum_in_program"]
    for block in (1, 7, 30):
        other = sharded_runs[f"{algorithm}/8/{block}"]
        assert other["psum_in_program"]  # the clients really were split over the devices
        np.testing.assert_allclose(other["losses"], reference["losses"], rtol=1e-5)
        for a, b in zip(other["leaves"], reference["leaves"]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_rounds_compile_once_when_sharded(sharded_runs):
    assert {run["compilations"] for run in sharded_runs.values()} == {1}


def test_asking_for_more_devices_than_there_are_is_an_error():
    with pytest.raises(ValueError, match="devices must be between 1 and 1 here, got 2"):
        client_mesh(2)
