"""Library log lines kept off the user's terminal: the commands that build and run programs
(`mcfl plan`, `run`, `sweep`, `reproduce`, `demo`, `select-k`) print their own results and
one-line errors, not what XLA, JAX, absl or orbax log on the way, unless ``--verbose``.

Two sources are quietened for the command's length and restored after it (an in-process
`mcfl.apps.cli.main` leaves its caller's logging as it was):

- XLA's C++ logging (absl's), e.g. the constant-folding alarms ("Constant folding an
  instruction is taking > 1s ... If you'd like to file a bug ...") that planning a
  100,000-client FeSEM run printed. They are ERROR lines, so only FATAL ones are kept: a real
  failure reaches the user as the exception it raises, in one line (`mcfl.apps.cli.main`).
  jaxlib sets absl's threshold from ``TF_CPP_MIN_LOG_LEVEL`` when it loads (JAX defaults it to
  1) and exposes the setter that JAX's own ``jax_logging_level`` uses, which works at any time,
  before or after the backend starts.
- The Python loggers of JAX, absl (which orbax and TFDS log through) and orbax: their
  warnings; errors still show.
"""

from __future__ import annotations

import contextlib
import logging
import os

try:
    from jax._src.lib import utils as jaxlib_utils
except ImportError:
    jaxlib_utils = None
# jaxlib's setter of absl's C++ threshold (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL); None on a
# jaxlib without it, where XLA's lines stay as they are
set_cpp_level = getattr(jaxlib_utils, "absl_set_min_log_level", None)

QUIET_LOGGERS = ("jax", "jaxlib", "absl", "orbax")
QUIET_LEVEL = logging.ERROR
CPP_QUIET_LEVEL = 3  # FATAL only: XLA's alarms are ERROR lines
CPP_LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"


def cpp_level_at_start() -> int:
    """The C++ threshold jaxlib started with (``TF_CPP_MIN_LOG_LEVEL``, which `import jax`
    defaults to 1): what a quiet command gives back."""
    try:
        return min(3, max(0, int(os.environ.get(CPP_LEVEL_VARIABLE, "1"))))
    except ValueError:
        return 1


@contextlib.contextmanager
def library_logs(verbose: bool):
    """The block runs with XLA's and the Python libraries' log lines off (module docstring),
    unless `verbose`, which leaves every log as it is."""
    if verbose:
        yield
        return
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(QUIET_LEVEL, logger.level))
    if set_cpp_level is not None:
        set_cpp_level(CPP_QUIET_LEVEL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
        if set_cpp_level is not None:
            set_cpp_level(cpp_level_at_start())
