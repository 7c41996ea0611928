"""Federated datasets: loading, partitioning, caching, and the flat on-device layout; and the
data users bring (`from_clients`, `from_arrays`, `plant`, `register`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

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
from mcfl.data.settings import (
    DATA_FIELDS,
    DEFAULT_CLIENTS,
    RECIPE_TEST_FRACTION,
    STANDARDIZED,
    DataSettings,
    DataSpec,
    resolve_data,
)
from mcfl.data.spec import Partition, parse_partition
from mcfl.data.synthetic import generate_synthetic
from mcfl.data.user import from_arrays, from_clients, plant
from mcfl.errors import DataError

__all__ = [
    "DATA_FIELDS",
    "DataSettings",
    "DataSpec",
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
    "resolve_data",
    "with_held_out",
]

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


def build_dataset(spec: DataSpec) -> FederatedDataset:
    """Build the federated dataset `spec` describes (on the host, then put on the device)."""
    if spec.is_users:
        return _user_dataset(spec)
    part, seed = spec.partition, spec.seed
    if spec.dataset == "synthetic":
        alpha, beta = spec.synthetic
        return generate_synthetic(spec.clients, alpha, beta, seed,
                                  test_fraction=spec.test_fraction)
    if spec.dataset == "fedem-synthetic":  # test rows: 5000 a client, unless a share is given
        return generate_fedem_synthetic(spec.clients, seed, spec.test_fraction)
    if spec.dataset == "leaf":
        if spec.data_dir is None:
            raise DataError("dataset 'leaf' needs --data-dir (a folder with train/ and test/ "
                            "JSON files)")
        dataset = load_leaf(spec.data_dir, spec.clients, test_fraction=spec.test_fraction,
                            seed=seed)
        true_cluster = read_true_cluster(spec.data_dir, dataset.client_ids)
        return dataset if true_cluster is None else dataclasses.replace(
            dataset, true_cluster=true_cluster)
    arrays = load_arrays(spec.dataset, spec.data_dir, spec.download)
    return partition_arrays(arrays, part, spec.clients, spec.test_fraction, spec.normalize,
                            seed, spec.samples_per_client)


def _user_dataset(spec: DataSpec) -> FederatedDataset:
    """A user's dataset (`registry`): pooled rows (`LabelledArrays`) are split like the
    built-in arrays, over `clients` (default 100) by the partition (IID when none is given);
    clients already split (a `FederatedDataset`) are used as they are, with planted clusters
    when the partition names only a planted recipe (`plant`)."""
    made = registry.build(spec.dataset, spec.dataset_args)
    if isinstance(made, LabelledArrays):
        part = spec.partition or parse_partition("iid")
        if part.kind == "natural":
            raise DataError(f"dataset {spec.dataset!r} returns pooled rows (LabelledArrays), "
                            "which have no natural split: give a --partition such as iid or "
                            "dirichlet:0.5, or return clients (mcfl.data.from_clients)")
        test_fraction = spec.test_fraction
        if test_fraction is None:
            test_fraction = RECIPE_TEST_FRACTION.get(part.kind, 0.2)
        normalization = spec.normalize
        if normalization is None:
            normalization = "standardize" if part.kind in STANDARDIZED else "scale"
        return partition_arrays(made, part, spec.clients or DEFAULT_CLIENTS, test_fraction,
                                normalization, spec.seed, spec.samples_per_client)
    what = f"dataset {spec.dataset!r} returns its {made.num_clients} clients already split"
    if spec.clients is not None and spec.clients != made.num_clients:
        raise DataError(f"{what}, but clients is {spec.clients}: give {made.num_clients} or "
                        "leave clients out")
    given = next((key for key in ("samples_per_client", "test_fraction", "normalize")
                  if getattr(spec, key) is not None), None)
    if given is not None:
        raise DataError(f"{what}: --{given.replace('_', '-')} does not apply to it (set it in "
                        f"its factory)")
    part = spec.partition
    if part is None or part.kind == "natural" and not part.planted:
        return made
    if not part.planted or part.kind != "iid":
        raise DataError(f"{what}: its partition may be natural or planted recipes alone "
                        f"(rotated:R, permuted:R, label_swap:R, shift_*:R@S), not "
                        f"{str(part)!r}")
    return plant(made, str(part).removesuffix("+iid"), spec.seed)


def with_held_out(dataset: FederatedDataset, spec: DataSpec) -> FederatedDataset:
    """`dataset` with ``spec.unseen_share`` of its clients held out of training
    (`mcfl.data.unseen`, seeded by the data seed); as it is without a share."""
    if spec.unseen_share is None:
        return dataset
    if dataset.unseen is not None:
        raise DataError(f"dataset {dataset.name!r} already holds clients out of training")
    return unseen.with_unseen(dataset, spec.unseen_share, spec.seed)


def load_dataset(spec: DataSpec, cache_dir: Optional[str | Path] = None) -> FederatedDataset:
    """The federated dataset of `spec` (`mcfl.load_dataset(config)` gives a config's), from
    `cache_dir` when it was built before (and stored there after building when not). Without
    `cache_dir` nothing is read or written, nor for a user's dataset (`registry`): its
    factory's code and files are out of the cache's sight, so it is built each time."""
    if not isinstance(spec, DataSpec):
        raise TypeError(f"mcfl.data.load_dataset takes a DataSpec, got {type(spec).__name__}; "
                        f"for a config, mcfl.load_dataset(config)")
    if cache_dir is None or spec.is_users:
        return build_dataset(spec)
    settings = {k: v for k, v in spec.describe().items() if k not in ("seed", "unseen_share",
                                                                       "download")}
    settings.update(seed=spec.seed, source=cache.source_fingerprint(spec.data_dir))
    path = cache.cache_path(Path(cache_dir), spec.dataset, cache.cache_key(settings))
    dataset = cache.load(path)
    if dataset is None:
        dataset = build_dataset(spec)
        cache.save(path, dataset)
    return dataset
