"""mcfl: clustered (multi-center) federated learning, simulated at scale in JAX."""

from mcfl.config import RunConfig, from_dict, load_file
from mcfl.errors import ConfigError, DataError, McflError, TrainingDivergedError
from mcfl.runner import RunResult, run

__version__ = "0.1.0"

__all__ = [
    "RunConfig",
    "RunResult",
    "run",
    "from_dict",
    "load_file",
    "McflError",
    "ConfigError",
    "DataError",
    "TrainingDivergedError",
]
