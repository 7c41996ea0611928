"""JAX's persistent compilation cache, on by default for the command line.

A run's programs (its round, its evaluation, the initialisation) depend only on the config's
shapes, so a repeated run, or a sweep over seeds, can load them from disk instead of compiling
them again (XLA compilation was 3 to 7 s of a 7 to 12 s Synthetic run). JAX keys each entry
by the program and the compiler, backend and flags, so a stale entry is never used.

The command line turns it on under ``<mcfl cache dir>/jax-compile`` (``--cache-dir`` or
``$MCFL_CACHE_DIR``, default ``~/.cache/mcfl``) unless ``--no-compile-cache`` or
``MCFL_NO_COMPILE_CACHE=1`` say no: it decides (`mcfl.apps.flags.setup_compile_cache`) and
calls `enable` or not; nothing here reads the environment. From Python, call `enable` once
before the first run. A cache directory the user already gave JAX
(``JAX_COMPILATION_CACHE_DIR``) is left as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import jax

from mcfl.data.cache import default_cache_dir

SUBDIRECTORY = "jax-compile"


def enable(cache_dir: Optional[str | Path] = None) -> Path:
    """Cache every compiled program under `cache_dir` (default: the mcfl cache directory's
    ``jax-compile``). Returns the folder in use. Programs of any size and compile time are
    kept: mcfl's rounds compile in seconds."""
    current = jax.config.jax_compilation_cache_dir
    if current:  # the user configured JAX's cache themselves
        return Path(current)
    if cache_dir is None:
        cache_dir = default_cache_dir() / SUBDIRECTORY
    path = Path(cache_dir).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
