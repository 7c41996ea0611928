"""The environment variables the command line reads for its user, each read here and passed on
as an argument: below the command line (mcfl.runtime, mcfl.runs, ...) nothing reads them, so
that a Python caller's settings are its arguments alone (tests/test_structure.py checks it).

- ``MCFL_NO_COMPILE_CACHE=1``: as ``--no-compile-cache`` (docs/accelerators.md).
- ``MCFL_MEMORY_LIMIT=8G``: the memory the checks take this machine to have
  (`mcfl.runtime.memory.limited`; docs/guide/running.md).

(The data and tracker locations, ``MCFL_CACHE_DIR``, ``TFDS_DATA_DIR``, ``WANDB_PROJECT``,
``MLFLOW_TRACKING_URI`` and ``MLFLOW_EXPERIMENT_NAME``, are defaults of the code that uses
them, for Python callers too.)
"""

from __future__ import annotations

import os
from typing import Optional

from mcfl.runtime import memory

COMPILE_CACHE_OFF_VARIABLE = "MCFL_NO_COMPILE_CACHE"
MEMORY_LIMIT_VARIABLE = memory.LIMIT_VARIABLE


def compile_cache_off() -> bool:
    """Whether ``MCFL_NO_COMPILE_CACHE`` turns JAX's persistent compilation cache off (any
    value but empty, 0, false, no)."""
    value = os.environ.get(COMPILE_CACHE_OFF_VARIABLE, "")
    return value.strip().lower() not in ("", "0", "false", "no")


def memory_limit() -> Optional[int]:
    """The bytes ``MCFL_MEMORY_LIMIT`` sets (a size such as 8G), or None when it is unset or
    empty; a value that is no size is refused in one line (`mcfl.runtime.memory.parse_size`)."""
    value = os.environ.get(MEMORY_LIMIT_VARIABLE, "")
    return memory.parse_size(value, MEMORY_LIMIT_VARIABLE) if value.strip() else None
