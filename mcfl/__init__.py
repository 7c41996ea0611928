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

# Importing mcfl changes nothing in the process's environment (tests/test_structure.py): the
# command line quiets libtpu itself (mcfl.apps.libtpu_environment).
from mcfl import algorithms, data, models, tracking, transforms
from mcfl.algorithms.framework.device import scan_rounds
from mcfl.config import RunConfig, from_dict, load_file
from mcfl.errors import ConfigError, DataError, McflError, TrainingDivergedError
from mcfl.runs.plan import Plan, resolve
from mcfl.runs.runner import RunObserver, RunOptions, RunResult, load_dataset, run
from mcfl.sweeps import SweepOptions, SweepResult, sweep

__version__ = "0.1.0"

__all__ = [
    "Plan",
    "RunConfig",
    "RunObserver",
    "RunOptions",
    "RunResult",
    "SweepOptions",
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
