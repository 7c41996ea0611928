"""Command lines of a process that a test means to kill at a fault point: ``python -c`` that
installs the fault (`mcfl.files.faults.install`) and then runs the code, or the `mcfl`
command line's `main` with the arguments given (what ``python -m mcfl ARGS`` runs). The fault
is installed in the child only; the test's own process and environment carry none."""

from __future__ import annotations

import sys

from mcfl.files.faults import FaultPlan


def python_killed_at(plan: FaultPlan, code: str) -> list[str]:
    """``python -c CODE`` with `plan` installed first."""
    return [sys.executable, "-c", "from mcfl.files import faults; from mcfl.files.faults "
            f"import FaultPlan; faults.install({plan!r}); {code}"]


def mcfl_killed_at(plan: FaultPlan, *args: str) -> list[str]:
    """``mcfl ARGS`` (the command line's `main`) with `plan` installed first."""
    return python_killed_at(plan, "from mcfl.apps.cli import main; "
                            f"raise SystemExit(main({list(map(str, args))!r}))")
