"""Federated datasets: loading, partitioning, and the flat on-device layout."""

from __future__ import annotations

from mcfl.config import RunConfig
from mcfl.data.federated import FederatedData, FederatedDataset, from_owner, from_splits
from mcfl.data.partition import dirichlet, iid
from mcfl.data.synthetic import generate_synthetic

__all__ = [
    "FederatedData",
    "FederatedDataset",
    "from_owner",
    "from_splits",
    "dirichlet",
    "iid",
    "generate_synthetic",
    "load_dataset",
]


def load_dataset(config: RunConfig) -> FederatedDataset:
    """The federated dataset a config names (built on the host, then put on the device)."""
    seed = config.seed if config.data_seed is None else config.data_seed
    # config.dataset is validated against DATASETS; synthetic is the only one so far.
    return generate_synthetic(
        config.clients,
        config.synthetic_alpha,
        config.synthetic_beta,
        seed,
        test_fraction=0.1 if config.test_fraction is None else config.test_fraction,
    )
