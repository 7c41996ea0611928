"""Fault injection: named points in a run where a test kills the process with SIGKILL.

A test installs the fault in the process it means to kill, before the run starts:
``faults.install(FaultPlan("checkpoint", 2, delay_ms=5))`` (or ``with faults.kill_at(...)``)
kills the process the 2nd time it passes the point ``checkpoint``, 5 ms later (from another
thread, so that the kill lands inside the work that follows: a checkpoint being written);
without a delay, at the point itself. The plan is an explicit call, not an environment
variable, so that no process inherits it by accident (tests/fault_driver.py starts a
``python -c`` that installs it and then runs the command line). The points: ``row`` (a row
of rounds.csv appended), ``checkpoint`` (a checkpoint about to be written), ``finished``
(the rounds done and the last checkpoint written, the final files not yet), ``replace`` (a
file's new version written, not yet renamed over the old), ``swap`` (a replacing run's file
moved into place, others not yet), ``store_write`` (a client's row about to be written to a
client store's folder, by the writer thread while the next round computes), ``cell`` (a
reproduced table's cell done and its files written). With no plan installed a point costs a
comparison. tests/test_faults.py kills runs this way and resumes them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import NamedTuple, Optional


class FaultPlan(NamedTuple):
    """Kill the process the `count`-th time it passes the point `name`, `delay_ms` later."""

    name: str
    count: int
    delay_ms: float = 0.0


_plan: Optional[FaultPlan] = None
_passed: dict[str, int] = {}


def install(plan: FaultPlan) -> None:
    """Kill this process as `plan` says (replacing any plan installed; the points' counts
    start again from zero)."""
    global _plan
    if plan.count < 1:
        raise ValueError(f"a fault's count is the n-th pass of its point (>= 1), got {plan}")
    _plan = plan
    _passed.clear()


def clear() -> None:
    """No fault: every point passes."""
    global _plan
    _plan = None
    _passed.clear()


@contextlib.contextmanager
def kill_at(name: str, count: int, delay_ms: float = 0.0) -> Iterator[FaultPlan]:
    """`install` ``FaultPlan(name, count, delay_ms)`` for the block; `clear` after it."""
    plan = FaultPlan(name, count, delay_ms)
    install(plan)
    try:
        yield plan
    finally:
        clear()


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def point(name: str) -> None:
    """Pass the point `name`: the process is killed here if the installed plan asks for it."""
    plan = _plan
    if plan is None or plan.name != name:
        return
    _passed[name] = _passed.get(name, 0) + 1
    if _passed[name] != plan.count:
        return
    if plan.delay_ms <= 0:
        _kill()
        return
    timer = threading.Timer(plan.delay_ms / 1000, _kill)
    timer.daemon = True
    timer.start()
