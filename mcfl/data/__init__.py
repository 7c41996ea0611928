"""Federated datasets: loading, partitioning, caching, and the flat on-device layout; and the
data users bring (`from_clients`, `from_arrays`, `plant`, `register`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np

from mcfl.data import cache, partition, registry, shifts, unseen
from mcfl.data.arrays import LabelledArrays
from mcfl.data.export import read_true_cluster
from mcfl.data.fedem_synthetic import generate_fedem_synthetic
from mcfl.data.federated import FederatedData, FederatedDataset, from_owner, from_splits
from mcfl.data.leaf import load_leaf
from mcfl.data.loaders import load_arrays, normalize
from mcfl.data.partition import dirichlet, iid
from mcfl.data.registry import register
from mcfl.data.settings import DATA_FIELDS, DEFAULT_CLIENTS, NATURAL, DataSettings
from mcfl.data.spec import Partition, parse_partition
from mcfl.data.synthetic import generate_synthetic
from mcfl.data.user import from_arrays, from_clients, plant
from mcfl.errors import DataError

if TYPE_CHECKING:
    from mcfl.config import RunConfig

__all__ = [
    "DATA_FIELDS",
    "DataSettings",
    "FederatedData",
    "FederatedDataset",
    "LabelledArrays",
    "from_arrays",
    "from_clients",
    "from_owner",
    "from_splits",
    "plant",
    "register",
    "dirichlet",
    "iid",
    "generate_synthetic",
    "generate_fedem_synthetic",
    "load_dataset",
    "build_dataset",
    "partition_arrays",
    "parse_partition",
]

# Recipe defaults (the authors' generators): the FedProx generators split 90/10, Ditto's test
# rows are 1/6 of its train rows (1/7 of all), everything else 80/20.
_TEST_FRACTION = {"fedprox-mnist": 0.1, "ditto-fmnist": 1 / 7}
_STANDARDIZED = ("fedprox-mnist", "ditto-fmnist")


def data_seed(config: RunConfig) -> int:
    return config.seed if config.data_seed is None else config.data_seed


def partition_of(config: RunConfig) -> Partition:
    """The config's partition, or the dataset's default (natural users, else IID)."""
    if config.partition is not None:
        return parse_partition(config.partition)
    return parse_partition("natural" if config.dataset in NATURAL else "iid")


def test_fraction_of(config: RunConfig, part: Partition) -> float:
    if config.test_fraction is not None:
        return config.test_fraction
    if config.dataset == "synthetic":
        return 0.1
    return _TEST_FRACTION.get(part.kind, 0.2)


def normalization_of(config: RunConfig, part: Partition) -> str:
    if config.normalize is not None:
        return config.normalize
    return "standardize" if part.kind in _STANDARDIZED else "scale"


def partition_arrays(
    arrays: LabelledArrays,
    part: Partition,
    num_clients: int,
    test_fraction: float,
    normalization: str,
    seed: int,
    samples_per_client: Optional[int] = None,
) -> FederatedDataset:
    """Split one labelled dataset over clients by `part`, planting clusters if asked; with
    `samples_per_client`, each client keeps that many of its rows at most (drawn at random)."""
    rng = np.random.default_rng(seed)
    y = arrays.y
    true_cluster = None
    if part.planted_kind("shift_y"):  # the groups decide which rows their clients may hold
        true_cluster = partition.planted_cluster_ids(num_clients, part.clusters, rng,
                                                     part.shares)
        holds = shifts.group_class_subsets(part.clusters, arrays.num_classes,
                                           dict(part.shifts)["shift_y"], rng)
        owner = _owners_within_groups(part, y, shifts.group_rows(y, holds, rng), true_cluster,
                                      arrays.num_classes, rng)
    else:
        owner = _owners(part, y, num_clients, arrays.num_classes, rng)
    if samples_per_client is not None:
        owner = partition.cap_rows(owner, samples_per_client, rng)

    x_raw = arrays.x
    if part.planted:
        if true_cluster is None:
            true_cluster = partition.planted_cluster_ids(num_clients, part.clusters, rng,
                                                         part.shares)
        row_cluster = np.where(owner >= 0, true_cluster[np.maximum(owner, 0)], 0)
        if part.shifts:
            x_raw, y = shifts.shift_rows(part.shifts, arrays.x, y, row_cluster, part.clusters,
                                         arrays.num_classes, rng)
        else:
            x_raw, y = partition.plant_rows(part.planted[0].kind, arrays.x, y, row_cluster,
                                            part.clusters, arrays.num_classes, rng)
    x = normalize(
        LabelledArrays(arrays.name, x_raw, y, arrays.num_classes, arrays.official_train),
        normalization,
    )
    return from_owner(
        f"{arrays.name}/{part}", x, y, owner, num_clients, arrays.num_classes, test_fraction,
        rng, true_cluster=true_cluster, stratify=True,
    )


def _owners(part: Partition, y: np.ndarray, num_clients: int, num_classes: int,
            rng: np.random.Generator) -> np.ndarray:
    """[N] the client of every row under the label partition `part.kind`."""
    if part.kind == "iid":
        return partition.iid(len(y), num_clients, rng)
    if part.kind == "dirichlet":
        return partition.dirichlet(y, num_clients, part.arg, rng)
    if part.kind == "shards":
        return partition.shards(y, num_clients, int(part.arg), num_classes, rng)
    if part.kind == "fedprox-mnist":
        return partition.fedprox_mnist(y, num_clients, num_classes, rng)
    if part.kind == "ditto-fmnist":
        return partition.ditto_fmnist(y, num_clients, num_classes, rng)
    # "natural" needs per-user data; validated in the config
    raise ValueError(f"partition {part.kind} does not apply to array datasets")


def _owners_within_groups(part: Partition, y: np.ndarray, row_group: np.ndarray,
                          true_cluster: np.ndarray, num_classes: int,
                          rng: np.random.Generator) -> np.ndarray:
    """[N] the client of every row under ``shift_y``: each group's rows (`row_group`) dealt to
    the group's clients by the label partition (iid, dirichlet or shards); -1 for rows of no
    group."""
    if part.kind not in ("iid", "dirichlet", "shards"):
        raise DataError(f"shift_y deals each group's rows to its clients by iid, dirichlet:ALPHA "
                        f"or shards:C, not {part.kind}")
    owner = np.full(len(y), -1, np.int64)
    for group in range(part.clusters):  # a loop over the R groups
        clients = np.flatnonzero(true_cluster == group)
        rows = np.flatnonzero(row_group == group)
        if rows.size < clients.size:
            raise DataError(f"shift_y group {group} holds {rows.size} rows for its "
                            f"{clients.size} clients; give fewer clients or a weaker shift")
        owner[rows] = clients[_owners(part, y[rows], clients.size, num_classes, rng)]
    return owner


def build_dataset(config: RunConfig) -> FederatedDataset:
    """Build the federated dataset a config names (on the host, then put on the device)."""
    part = partition_of(config)
    seed = data_seed(config)
    if registry.is_user_dataset(config.dataset):
        return _user_dataset(config, seed)
    if config.dataset == "synthetic":
        return generate_synthetic(
            config.clients, config.synthetic_alpha, config.synthetic_beta, seed,
            test_fraction=test_fraction_of(config, part),
        )
    if config.dataset == "fedem-synthetic":  # test rows: 5000 a client, unless a share is given
        return generate_fedem_synthetic(config.clients, seed, config.test_fraction)
    if config.dataset == "leaf":
        if config.data_dir is None:
            raise DataError("dataset leaf needs --data-dir DIR holding its train/ and test/ "
                            "folders of LEAF JSON files")
        dataset = load_leaf(config.data_dir, config.clients, test_fraction=config.test_fraction,
                            seed=seed)
        # (planted clusters written beside the files by `mcfl data export`)
        true_cluster = read_true_cluster(config.data_dir, dataset.client_ids)
        return dataset if true_cluster is None else dataclasses.replace(
            dataset, true_cluster=true_cluster)
    arrays = load_arrays(config.dataset, config.data_dir, config.download)
    return partition_arrays(
        arrays, part, config.clients, test_fraction_of(config, part),
        normalization_of(config, part), seed, config.samples_per_client,
    )


def _user_dataset(config: RunConfig, seed: int) -> FederatedDataset:
    """A user's dataset (`registry`): pooled rows (`LabelledArrays`) are split like the
    built-in arrays, over `clients` (default 100) by the partition; clients already split (a
    `FederatedDataset`) are used as they are, with planted clusters when the partition names
    only a planted recipe (`plant`)."""
    made = registry.build(config.dataset, config.dataset_args)
    if isinstance(made, LabelledArrays):
        part = partition_of(config)
        if part.kind == "natural":
            raise DataError(f"dataset {config.dataset!r} returns pooled rows (LabelledArrays), "
                            "which have no natural split: give a --partition such as iid or "
                            "dirichlet:0.5, or return clients (mcfl.data.from_clients)")
        return partition_arrays(
            made, part, config.clients or DEFAULT_CLIENTS, test_fraction_of(config, part),
            normalization_of(config, part), seed, config.samples_per_client,
        )
    what = f"dataset {config.dataset!r} returns its {made.num_clients} clients already split"
    if config.clients is not None and config.clients != made.num_clients:
        raise DataError(f"{what}, but clients is {config.clients}: give {made.num_clients} or "
                        "leave clients out")
    given = next((key for key in ("samples_per_client", "test_fraction", "normalize")
                  if getattr(config, key) is not None), None)
    if given is not None:
        raise DataError(f"{what}: {given} does not apply to it (set it in its factory)")
    if config.partition is None:
        return made
    part = parse_partition(config.partition)
    if part.kind == "natural":
        return made
    with_label_partition = config.partition.count("+") + 1 > len(part.planted)
    if not part.planted or with_label_partition:
        raise DataError(f"{what}: its partition may be natural or planted recipes alone "
                        f"(rotated:R, permuted:R, label_swap:R, shift_*:R@S), not "
                        f"{config.partition!r}")
    return plant(made, config.partition, seed)


def with_all_users(config: RunConfig, cache_dir: Optional[str | Path] = None
                   ) -> tuple[RunConfig, Optional[FederatedDataset]]:
    """`config` with its number of clients, and its dataset when that had to be loaded to
    count them: a natural dataset (leaf) given no `clients` uses all its users, and a user's
    dataset all the clients its factory split (pooled rows: 100)."""
    if config.clients is not None:
        return config, None
    dataset = load_dataset(config, cache_dir)
    return config.replace(clients=dataset.num_clients), dataset


def with_held_out(dataset: FederatedDataset, config: RunConfig) -> FederatedDataset:
    """`dataset` with ``config.unseen_share`` of its clients held out of training
    (`mcfl.data.unseen`, seeded by the data seed); as it is without a share."""
    if config.unseen_share is None:
        return dataset
    if dataset.unseen is not None:
        raise DataError(f"dataset {dataset.name!r} already holds clients out of training")
    return unseen.with_unseen(dataset, config.unseen_share, data_seed(config))


def load_dataset(config: RunConfig, cache_dir: Optional[str | Path] = None) -> FederatedDataset:
    """The config's federated dataset, from `cache_dir` when it was built before (and stored
    there after building when not). Without `cache_dir` nothing is read or written, nor for a
    user's dataset (`registry`): its factory's code and files are out of the cache's sight, so
    it is built each time."""
    if cache_dir is None or registry.is_user_dataset(config.dataset):
        return build_dataset(config)
    settings = {name: getattr(config, name) for name in DATA_FIELDS}
    settings.update(seed=data_seed(config), partition=str(partition_of(config)),
                    source=cache.source_fingerprint(config.data_dir))
    path = cache.cache_path(Path(cache_dir), config.dataset, cache.cache_key(settings))
    dataset = cache.load(path)
    if dataset is None:
        dataset = build_dataset(config)
        cache.save(path, dataset)
    return dataset
