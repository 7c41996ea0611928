"""Quiet JAX start-up where the TPU compiler is installed but no TPU is (`mcfl[tpu-aot]`).

With libtpu installed, JAX tries a TPU backend first. On a machine without TPU chips that
attempt fails, as it should, and JAX goes on with the CPU; but libtpu first writes three lines
to stderr asking for its environment (``TPU_ACCELERATOR_TYPE``, ``TPU_WORKER_HOSTNAMES``), on
every command. Naming a placeholder environment for it there keeps them off the output; the
topologies `mcfl.planning.tpu_compile` compiles for are named explicitly and do not read it.
libtpu also takes a lock file (/tmp/libtpu_lockfile) that lets one process at a time hold
the chips; with no chips to hold, ``ALLOW_MULTIPLE_LIBTPU_LOAD`` lets several processes
compile at once (two `mcfl plan` commands, the test suite's workers). Nothing is set where
TPU chips are present, or where the user set any of these variables.

The `mcfl` program calls `quiet_libtpu_without_tpu` as it starts (`mcfl.apps.cli.main`, run
as the program), before JAX starts a backend; its children inherit the variables. Importing
mcfl sets nothing: a Python caller's environment is its own (the test suite names the
placeholder itself, in tests/conftest.py, for its workers).
"""

from __future__ import annotations

import importlib.util
import os

try:  # JAX's own check for TPU chips (internal: it may move)
    from jax._src import hardware_utils
except ImportError:
    hardware_utils = None

PLACEHOLDER = {"TPU_ACCELERATOR_TYPE": "v5litepod-1", "TPU_WORKER_HOSTNAMES": "localhost",
               "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def has_tpu_chips() -> bool:
    """Whether this machine has TPU chips (JAX's own check, on its PCI devices)."""
    if hardware_utils is None:  # an internal helper that moved: assume chips, set nothing
        return True
    try:
        return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
    except Exception:  # it reads the PCI devices: any failure, assume chips
        return True


def quiet_libtpu_without_tpu() -> bool:
    """Name the placeholder environment when libtpu is installed and no chips are here (call
    before JAX starts its backends); whether it was named."""
    if importlib.util.find_spec("libtpu") is None or any(k in os.environ for k in PLACEHOLDER):
        return False
    if has_tpu_chips():
        return False
    os.environ.update(PLACEHOLDER)
    return True
