"""Two processes (jax.distributed on 127.0.0.1, CPU collectives over gloo) run the same FedAvg
and FeSEM rounds as one process with as many devices, to float tolerance."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import xla_flags_with_devices

HERE = Path(__file__).parent
SCRIPT = str(HERE / "multihost_check.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict:
    return {**os.environ, "PYTHONPATH": str(HERE.parent),
            "XLA_FLAGS": xla_flags_with_devices(devices)}


@pytest.fixture(scope="module")
def runs():
    port = _free_port()
    workers = [subprocess.Popen(
        [sys.executable, SCRIPT, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
         "--process-id", str(i)], env=_env(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for i in range(2)]
    # the one-process run beside them: the two wait on each other's collectives
    alone = subprocess.Popen([sys.executable, SCRIPT], env=_env(2), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        outputs = [w.communicate(timeout=600) for w in workers]
        alone_out, alone_err = alone.communicate(timeout=600)
    finally:
        for w in (*workers, alone):
            w.kill()
    for w, (_, err) in zip(workers, outputs):
        assert w.returncode == 0, err[-3000:]
    assert alone.returncode == 0, alone_err[-3000:]
    # Only process 0 reports (gloo prints a line of its own on each)
    assert "{" not in outputs[1][0]
    return json.loads(outputs[0][0].strip().splitlines()[-1]), json.loads(alone_out)


@pytest.mark.parametrize("algorithm", ["fedavg", "fesem"])
def test_two_processes_agree_with_one(runs, algorithm):
    multi, single = runs
    assert multi["processes"] == 2 and multi["devices"] == 2 and single["devices"] == 2
    assert multi[algorithm]["devices"] == single[algorithm]["devices"] == 2
    np.testing.assert_allclose(multi[algorithm]["losses"], single[algorithm]["losses"],
                               rtol=1e-5)
    assert multi[algorithm]["accuracy"] == pytest.approx(single[algorithm]["accuracy"], abs=1e-6)
    for a, b in zip(multi[algorithm]["leaves"], single[algorithm]["leaves"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
