"""mcfl: clustered (multi-center) federated learning, simulated at scale in JAX.

The public API: `run` a `RunConfig` (results as a `RunResult`; `RunObserver` to follow a run;
`resolve` gives the `Plan` a config resolves to, and `load_dataset` its dataset),
the algorithm registry (`mcfl.algorithms`: `names`, `get`, `build`, `register`,
`AlgorithmContext`), `sweep` to run many seeds and hyperparameter values as one vmapped
program (tables as a `SweepResult`), and `scan_rounds` to run many rounds as one
`lax.scan`. `mcfl.models` (any flax module, the registry, the zoo) and `mcfl.data`
(`from_clients`, `from_arrays`, `plant`, the dataset registry) take a user's own model and
data. `mcfl.tracking` sends runs to TensorBoard, MLflow or W&B (observers such as
``mcfl.tracking.TensorBoard(DIR)``). The command line, run folders and plots live in
`mcfl.apps`.
"""

from mcfl.runtime.libtpu_environment import quiet_libtpu_without_tpu

quiet_libtpu_without_tpu()  # before JAX starts a backend (mcfl.runtime.libtpu_environment)

from mcfl import algorithms, data, models, tracking, transforms  # noqa: E402
from mcfl.algorithms.device import scan_rounds  # noqa: E402
from mcfl.config import RunConfig, from_dict, load_file  # noqa: E402
from mcfl.errors import ConfigError, DataError, McflError, TrainingDivergedError  # noqa: E402
from mcfl.runs.plan import Plan, resolve  # noqa: E402
from mcfl.runs.runner import RunObserver, RunResult, load_dataset, run  # noqa: E402
from mcfl.sweeps import SweepResult, sweep  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Plan",
    "RunConfig",
    "RunObserver",
    "RunResult",
    "SweepResult",
    "algorithms",
    "data",
    "load_dataset",
    "models",
    "resolve",
    "run",
    "scan_rounds",
    "sweep",
    "tracking",
    "transforms",
    "from_dict",
    "load_file",
    "McflError",
    "ConfigError",
    "DataError",
    "TrainingDivergedError",
]
