"""What every tracker does (`Tracker`), whatever its backend: open a tracking run with the
config as hyperparameters, log every round's numbers at step = the round, close it with the
summary and the plots; and the names, values and plots they log (`mcfl.tracking`)."""

from __future__ import annotations

import copy
import importlib
import math
import re
import tempfile
from pathlib import Path
from typing import Any, Optional

from mcfl.errors import ConfigError, McflError
from mcfl.files.figures import plot_curves
from mcfl.runs.folder import title_of
from mcfl.runs.runner import RunObserver


def require(kind: str, module: str) -> None:
    """Import `module` (the tracker's library), or refuse in one line naming the extra."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"--log {kind} needs the {module} package: "
                          f"pip install 'mcfl[{kind}]'") from None


def run_name(config) -> str:
    """A run's tracking name: as its default folder, ALGORITHM-DATASET-cCLIENTS-sSEED."""
    return f"{config.algorithm}-{config.dataset}-c{config.clients}-s{config.seed}"


def point_label(point) -> str:
    """A sweep member's grid point as text, ``lr=0.01,mu=0.1`` ("all" without a grid)."""
    return ",".join(f"{name}={value}" for name, value in point) or "all"


def member_name(member, spec: dict[str, Any]) -> str:
    """A member's name within its grid point: its seed, and its data seed when the sweep
    varies the data seed (`data_seeds`)."""
    data = f"-data-seed-{member.data_seed}" if spec.get("data_seeds") is not None else ""
    return f"seed-{member.seed}{data}"


def path_part(text: str) -> str:
    """`text` as one folder name (characters other than letters, digits and ``=,.+-_`` become
    ``_``)."""
    return re.sub(r"[^\w=,.+-]", "_", text) or "_"


def hyperparameters(config) -> dict[str, Any]:
    """The config's flat keys with values a tracker takes: booleans, numbers and texts as they
    are, anything else (None, lists) as its text."""
    return {key: value if isinstance(value, (bool, int, float, str)) else str(value)
            for key, value in config.to_dict().items()}


def numbers(values: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of `values` (not booleans), nested mappings as ``outer/inner``."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(numbers(value, f"{prefix}{key}/"))
        elif (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value)):
            out[f"{prefix}{key}"] = float(value)
    return out


def round_metrics(row: dict[str, Any]) -> dict[str, float]:
    """A row's numbers but its round (the step they are logged at)."""
    return {k: v for k, v in numbers(row).items() if k != "round"}


def summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The summary's numbers as ``summary/KEY`` (``summary/dataset/clients``; not the config,
    logged as hyperparameters), apart from the round metrics of the same names."""
    return numbers({k: v for k, v in summary.items() if k != "config"}, "summary/")


class Tracker(RunObserver):
    """A `mcfl.RunObserver` that sends a run to an experiment tracker. A backend opens its
    tracking run (`open`), logs numbers at a step (`log`) and closes the run with the summary
    and the plots (`close`); `name` and `group` are None for a single run (named by
    `run_name`) and set for a sweep member (`member`), with `tags` naming its grid point,
    seed, data seed and index."""

    kind = ""  # as in --log KIND
    module = ""  # the library it needs

    def __init__(self):
        require(self.kind, self.module)
        self.name: Optional[str] = None
        self.group: Optional[str] = None
        self.tags: dict[str, str] = {}
        self.step = 0  # the last round logged
        self.running = False

    def member(self, member, spec: dict[str, Any]) -> Tracker:
        """A tracker like this one for sweep member `member` (`mcfl.sweeps.spec.Member`) of
        the sweep `spec` (its sweep.json): named by its seed, grouped by its grid point."""
        out = copy.copy(self)
        out.group = point_label(member.point)
        out.name = member_name(member, spec)
        out.tags = {"grid_point": out.group, "seed": str(member.seed),
                    "data_seed": str(member.data_seed), "member": str(member.index)}
        return out

    # What a backend does.
    def open(self, config, name: str) -> None:
        raise NotImplementedError

    def log(self, values: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def close(self, summary: dict[str, Any], plots: list[Path]) -> None:
        raise NotImplementedError

    # The run's side (RunObserver).
    def started(self, config, later_columns) -> None:
        self.step = 0
        try:
            self.open(config, self.name or run_name(config))
        except ConfigError:
            raise
        except Exception as e:  # a server that cannot be reached, a login missing, ...
            text = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise McflError(f"--log {self.kind} could not start its run: {text}") from e
        self.running = True

    def round(self, row) -> None:
        self.step = row["round"]
        self.log(round_metrics(row), self.step)

    def stopped(self, summary) -> None:
        if self.running:
            self.running = False
            self.close(summary, [])

    def finished(self, result) -> None:
        if not self.running:
            return
        self.running = False
        with tempfile.TemporaryDirectory(prefix="mcfl-plots-") as folder:
            plots = []
            if result.rounds:
                plots.append(Path(folder) / "curves.png")
                plot_curves(plots[-1], result.rounds, title=title_of(result.config))
            self.close(result.summary, plots)
