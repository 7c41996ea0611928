"""Fault injection: named points in a run where a test kills the process with SIGKILL.

``MCFL_KILL_AT=NAME:N`` kills the process at the N-th time it passes the point NAME, and
``MCFL_KILL_AT=NAME:N:MS`` MS milliseconds later (from another thread, so that the kill lands
inside the work that follows: a checkpoint being written). The points: ``row`` (a row of
rounds.csv appended), ``checkpoint`` (a checkpoint about to be written), ``finished`` (the
rounds done and the last checkpoint written, the final files not yet), ``replace`` (a file's
new version written, not yet renamed over the old), ``swap`` (a replacing run's file moved
into place, others not yet), ``store_write`` (a client's row about to be written to a client
store's folder, by the writer thread while the next round computes), ``cell`` (a reproduced
table's cell done and its files written). Without the variable a
point costs a dictionary lookup. tests/test_faults.py kills runs this way and resumes them.
"""

from __future__ import annotations

import os
import signal
import threading

VARIABLE = "MCFL_KILL_AT"
_passed: dict[str, int] = {}


def _target() -> tuple[str, int, float] | None:
    spec = os.environ.get(VARIABLE)
    if not spec:
        return None
    name, count, *delay = spec.split(":")
    return name, int(count), float(delay[0]) / 1000 if delay else 0.0


def point(name: str) -> None:
    """Pass the point `name`: the process is killed here if the fault asks for it."""
    target = _target()
    if target is None or target[0] != name:
        return
    _passed[name] = _passed.get(name, 0) + 1
    if _passed[name] != target[1]:
        return
    if target[2] <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
    timer = threading.Timer(target[2], os.kill, (os.getpid(), signal.SIGKILL))
    timer.daemon = True
    timer.start()
