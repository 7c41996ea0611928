"""``--log wandb[:PROJECT]``: a run as a Weights & Biases run.

W&B's own settings apply: WANDB_MODE (``offline`` keeps the run in WANDB_DIR/wandb/ for a
later ``wandb sync``; online needs ``wandb login`` or WANDB_API_KEY), WANDB_DIR, WANDB_ENTITY,
WANDB_SILENT. The project is the one given, else $WANDB_PROJECT, else "mcfl". The config is the
run's config, every round's numbers are logged at step = the round, the summary goes to the
run's summary (numbers and texts, ``dataset/clients`` for nested ones) and the plots are
images (``plots/NAME``) at the last round. A sweep member's run is named by its seed and
grouped by its grid point (``group=``), with its grid point, seed, data seed and index in its
config under ``sweep_member``; each member is a run of its own (``reinit="create_new"``),
several open at once. The run ends with exit code 0 when it completed, else 1.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from mcfl.tracking.base import Tracker, numbers

DEFAULT_PROJECT = "mcfl"


class WandB(Tracker):
    """Runs in the W&B project `project`."""

    kind = module = "wandb"

    def __init__(self, project: Optional[str] = None):
        super().__init__()
        self.project = project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        self._run = None

    @property
    def run(self):
        """The `wandb.Run` once it was started."""
        return self._run

    def open(self, config, name: str) -> None:
        import wandb

        values = config.to_dict()
        if self.tags:
            values["sweep_member"] = dict(self.tags)
        self._run = wandb.init(project=self.project, name=name, group=self.group,
                               config=values, reinit="create_new")

    def log(self, values: dict[str, float], step: int) -> None:
        self._run.log(values, step=step)

    def close(self, summary: dict[str, Any], plots: list[Path]) -> None:
        import wandb

        texts = {k: v for k, v in summary.items() if isinstance(v, str)}
        self._run.summary.update({**numbers({k: v for k, v in summary.items()
                                             if k != "config"}), **texts})
        if plots:
            self._run.log({f"plots/{path.stem}": wandb.Image(str(path)) for path in plots},
                          step=self.step)
        self._run.finish(exit_code=0 if summary.get("status") == "completed" else 1)
        self._run = None
