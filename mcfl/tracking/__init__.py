"""Experiment tracking: a run (or each member of a sweep) sent to TensorBoard, MLflow or
Weights & Biases as it goes, for researchers who watch long runs there.

Each tracker is a `mcfl.RunObserver` (`Tracker`): when the run starts it opens a tracking run
and logs the config as hyperparameters (``config.to_dict()``); every round it logs the row's
numbers at step = the round (``cluster_sizes``, a text, stays in rounds.csv); at the end it
logs the summary's numbers (as ``summary/KEY``; W&B: the run's summary) and its status, and
for a completed run the plots. Plots are made when a run completes (its run folder's
curves.png is written after the observers hear of it, and a run without a folder has none),
so each tracker renders what `mcfl.files.figures` draws from the result, the accuracy and loss
curves, into a temporary folder and logs that PNG; the clients' cluster plot
(`mcfl plot clusters`) is made on demand from the run folder and is not logged.

``--log tensorboard:DIR``, ``--log mlflow[:URI]``, ``--log wandb[:PROJECT]`` (`from_spec`) on
`mcfl run` and `mcfl sweep`; in Python ``mcfl.run(config, observers=[TensorBoard("tb")])``
and ``mcfl.sweep(config, ..., observers=[MLflow()])``, where each member becomes a tracking run
of its own (`Tracker.member`), grouped by its grid point. The libraries are optional extras
(``pip install 'mcfl[tensorboard]'``, ``mcfl[mlflow]``, ``mcfl[wandb]``), imported when a
tracker is made, so a missing one is refused before the run starts.
"""

from __future__ import annotations

from mcfl.errors import ConfigError
from mcfl.tracking.base import Tracker
from mcfl.tracking.mlflow_runs import MLflow
from mcfl.tracking.tensorboard_runs import TensorBoard
from mcfl.tracking.wandb_runs import WandB

__all__ = ["MLflow", "TensorBoard", "Tracker", "WandB", "from_spec", "from_specs"]

FORMS = "tensorboard:DIR, mlflow, mlflow:URI, wandb, wandb:PROJECT"


def from_spec(text: str) -> Tracker:
    """The tracker a ``--log`` value names: ``tensorboard:DIR``, ``mlflow`` (the tracking URI
    of $MLFLOW_TRACKING_URI, else ./mlruns), ``mlflow:URI``, ``wandb`` (the project of
    $WANDB_PROJECT, else mcfl) or ``wandb:PROJECT``; a bad value or a missing library is one
    `ConfigError` line."""
    kind, colon, argument = text.partition(":")
    backends = {"tensorboard": TensorBoard, "mlflow": MLflow, "wandb": WandB}
    if kind not in backends:
        raise ConfigError(f"unknown --log {text!r}; allowed: {FORMS}")
    if colon and not argument.strip():
        raise ConfigError(f"--log {text!r} names nothing after the colon; allowed: {FORMS}")
    if kind == "tensorboard" and not colon:
        raise ConfigError(f"--log {text!r} needs a folder: tensorboard:DIR (allowed: {FORMS})")
    return backends[kind](argument or None)


def from_specs(texts) -> tuple[Tracker, ...]:
    """The trackers of every ``--log`` value (none given: none)."""
    return tuple(from_spec(text) for text in texts or ())
