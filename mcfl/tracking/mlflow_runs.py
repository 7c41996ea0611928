"""``--log mlflow[:URI]``: a run as an MLflow run, through `mlflow.tracking.MlflowClient` (so
that several runs, a sweep's members, can be open at once; `mlflow-skinny` suffices).

The tracking URI is the one given, else $MLFLOW_TRACKING_URI, else the file store ./mlruns
(made absolute when the tracker is made). MLflow 3 keeps its file store in maintenance mode
and refuses it unless MLFLOW_ALLOW_FILE_STORE is true (mlflow-skinny has no other local
store: a sqlite:/// URI needs SQLAlchemy). MLflow takes that choice from the environment only
(its FileStore reads the variable as it is made; neither MlflowClient nor the store takes it
as an argument), so for a file store, where the variable is unset, this tracker sets it
while it makes its client and the store (`_file_store_allowed`) and removes it again: the
process's environment is as it was after `open`, and MLflow keeps the store it made for the
URI. ``mlflow ui --backend-store-uri ./mlruns`` shows it. The experiment is "mcfl"
unless $MLFLOW_EXPERIMENT_NAME names another. The config is the run's params (texts), every
round's numbers its metrics at step = the round, the summary's numbers ``summary/KEY``
metrics and the whole summary the artifact summary.json, the plots artifacts under plots/; a
sweep member's run is named by its seed and tagged with its grid point (``grid_point``),
``seed``, ``data_seed`` and ``member``. The run ends FINISHED, KILLED (interrupted) or FAILED
(diverged, an error), tagged with its ``status``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

from mcfl.files.run_folder import json_safe
from mcfl.tracking.base import Tracker, hyperparameters, summary_metrics

DEFAULT_URI = "mlruns"
DEFAULT_EXPERIMENT = "mcfl"
# MLflow's limit on the params of one log_batch call.
PARAMS_PER_CALL = 100
END_STATES = {"completed": "FINISHED", "interrupted": "KILLED"}  # else FAILED
ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"


def is_file_store(uri: str) -> bool:
    return urlparse(uri).scheme in ("", "file")


@contextlib.contextmanager
def _file_store_allowed(file_store: bool) -> Iterator[None]:
    """MLFLOW_ALLOW_FILE_STORE=true for the block, for a file store where the user left it
    unset (MLflow reads it from the environment only; module docstring); unset again after."""
    if not file_store or ALLOW_FILE_STORE in os.environ:
        yield
        return
    os.environ[ALLOW_FILE_STORE] = "true"
    try:
        yield
    finally:
        os.environ.pop(ALLOW_FILE_STORE, None)


class MLflow(Tracker):
    """Runs in the MLflow tracking store at `uri`, in experiment `experiment`."""

    kind = module = "mlflow"

    def __init__(self, uri: Optional[str] = None, experiment: Optional[str] = None):
        super().__init__()
        uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
        if urlparse(uri).scheme == "":  # a folder: the file store there, wherever we run
            uri = Path(uri).expanduser().absolute().as_uri()
        self.uri = uri
        self.experiment = (experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME")
                           or DEFAULT_EXPERIMENT)
        self._client = None
        self._run_id: Optional[str] = None

    @property
    def run_id(self) -> Optional[str]:
        """The MLflow run's id once it was started."""
        return self._run_id

    def open(self, config, name: str) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        with _file_store_allowed(is_file_store(self.uri)):
            self._client = client = MlflowClient(self.uri)
            run = client.create_run(self._experiment_id(), run_name=name, tags=self.tags)
        self._run_id = run.info.run_id
        params = [Param(key, str(value)) for key, value in hyperparameters(config).items()]
        for start in range(0, len(params), PARAMS_PER_CALL):
            client.log_batch(self._run_id, params=params[start:start + PARAMS_PER_CALL])

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        found = self._client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        try:
            return self._client.create_experiment(self.experiment)
        except MlflowException:  # made meanwhile by another process
            found = self._client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    def log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(self._run_id, metrics=[
            Metric(key, value, now, step) for key, value in values.items()])

    def close(self, summary: dict[str, Any], plots: list[Path]) -> None:
        status = summary.get("status", "completed")
        self.log(summary_metrics(summary), self.step)
        self._client.set_tag(self._run_id, "status", status)
        self._client.log_dict(self._run_id, json_safe(summary), "summary.json")
        for path in plots:
            self._client.log_artifact(self._run_id, str(path), artifact_path="plots")
        self._client.set_terminated(self._run_id, END_STATES.get(status, "FAILED"))
