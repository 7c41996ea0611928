"""The data settings of a run (`mcfl.config.RunConfig.data`): which dataset, over how many
clients, split how, and the checks across them. The data package owns them: they are what
builds a dataset and keys its cache (`DATA_FIELDS`)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from mcfl.data import registry
from mcfl.data.spec import parse_partition
from mcfl.errors import ConfigError, choice_error
from mcfl.settings import INT64_MAX, setting

DATASETS = ("synthetic", "fedem-synthetic", "mnist5k", "mnist", "fmnist", "digits", "cifar10",
            "cifar100", "leaf", "tfds:NAME")
TFDS_NAMES = ("mnist", "fashion_mnist", "emnist", "cifar10", "cifar100", "celeb_a")
NORMALIZATIONS = ("scale", "standardize", "none")
NATURAL = ("synthetic", "fedem-synthetic", "leaf")  # datasets split by their own users
DEFAULT_CLIENTS = 100  # clients of a dataset that is not split by its users
RECIPE_CLIENTS = {"fedem-synthetic": 300}  # a recipe's own default (the paper's)


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """The clients' data: which dataset, over how many clients, split how."""

    dataset: str = setting("synthetic", "synthetic | fedem-synthetic | mnist5k | mnist | fmnist | "
                           "digits | cifar10 | cifar100 | leaf | tfds:NAME | a registered name | "
                           "module.path:factory (mcfl.data.registry)")
    dataset_args: dict = setting({}, "keyword arguments of a registered or import-path "
                                 "dataset's factory, a JSON object: '{\"n\": 3}'")
    clients: Optional[int] = setting(None, "number of clients (default: all the users of a "
                                     "natural dataset (leaf) and all the clients a user's "
                                     "factory split, 300 for fedem-synthetic, else 100)",
                                     minimum=1)
    data_seed: Optional[int] = setting(None, "seed of the dataset (default: --seed)", minimum=0,
                                       maximum=INT64_MAX)
    data_dir: Optional[str] = setting(None, "folder holding the dataset's files")
    download: bool = setting(False, "let tensorflow-datasets download the data (never by "
                             "default)")
    partition: Optional[str] = setting(
        None, "iid | dirichlet:ALPHA | shards:C | fedprox-mnist | ditto-fmnist | natural | "
        "rotated:R | permuted:R | label_swap:R | shift_x:R@S | shift_y:R@S | "
        "shift_y_given_x:R@S | shift_x_given_y:R@S (joinable: rotated:4+dirichlet:0.5, "
        "shift_x:4@0.5+shift_y:4@0.5+dirichlet:0.3); default: "
        "natural for synthetic, fedem-synthetic and leaf, else iid")
    samples_per_client: Optional[int] = setting(
        None, "split datasets: keep at most this many rows (train + test) of each client, "
        "drawn at random (IFCA's n); default all", minimum=1)
    test_fraction: Optional[float] = setting(
        None, "per-client test share (default: the recipe's: 0.1 FedProx, 1/7 Ditto, else 0.2; "
        "fedem-synthetic: 5000 test rows per client; leaf: its own test files, unless given: "
        "then each user's rows are split again)",
        above=0, below=1)
    normalize: Optional[str] = setting(None, "scale | standardize | none (default: the "
                                       "partition recipe's)", choices=NORMALIZATIONS)
    synthetic_alpha: float = setting(1.0, "Synthetic(alpha, beta): how much local models "
                                     "differ", minimum=0)
    synthetic_beta: float = setting(1.0, "Synthetic(alpha, beta): how much local inputs differ",
                                    minimum=0)
    unseen_share: Optional[float] = setting(
        None, "share of the clients held out of training and scored at every evaluation with "
        "a model chosen without their labels (mcfl.data.unseen); default none", above=0, below=1)


# The settings that shape a dataset, besides its seed (`download` only says where it may come
# from; `unseen_share` splits the dataset once built, `mcfl.data.unseen`): a prepared dataset
# is cached under them.
DATA_FIELDS = tuple(f.name for f in dataclasses.fields(DataSettings)
                    if f.name not in ("data_seed", "download", "unseen_share"))


def default_clients(dataset: str) -> int:
    """The clients of `dataset` when `clients` is not given (and it does not count its own)."""
    return RECIPE_CLIENTS.get(dataset, DEFAULT_CLIENTS)


def counts_own_clients(dataset: str) -> bool:
    """Whether `dataset` may know its clients before `clients` is set: leaf (its users) and a
    user's dataset (`registry`), whose factory may return clients already split."""
    return dataset == "leaf" or registry.is_user_dataset(dataset)


def check_data(data: DataSettings) -> None:
    """The checks across the data settings: a known dataset (built in, tfds:NAME, registered,
    or an import path that imports), a partition it can take."""
    user = registry.is_user_dataset(data.dataset)
    if user and data.dataset in DATASETS:
        raise ConfigError(f"dataset {data.dataset!r} is built in and also registered; register "
                          "yours under another name")
    if data.dataset.startswith("tfds:"):
        base = data.dataset[len("tfds:"):].split("/")[0]
        if base not in TFDS_NAMES:
            raise choice_error("tfds dataset", base, TFDS_NAMES)
    elif user:
        registry.resolve(data.dataset)
    elif data.dataset not in DATASETS:
        raise choice_error("dataset", data.dataset,
                           DATASETS + registry.names() + ("module.path:factory",))
    if data.dataset_args and not user:
        raise ConfigError(f"dataset_args apply to a registered dataset or an import path "
                          f"(module.path:factory), not {data.dataset!r}")
    if data.partition is not None:
        part = parse_partition(data.partition)
        natural_only = data.dataset in NATURAL
        if natural_only and (part.kind != "natural" or part.planted):
            raise ConfigError(
                f"dataset {data.dataset!r} comes split by its own users: its partition is "
                f"'natural', not {data.partition!r}"
            )
        if not natural_only and not user and part.kind == "natural":
            raise ConfigError(
                f"partition 'natural' needs per-user data (dataset synthetic, "
                f"fedem-synthetic, leaf or a user's factory), not {data.dataset!r}"
            )
    if data.samples_per_client is not None and data.dataset in NATURAL:
        raise ConfigError(f"samples_per_client applies to datasets split over clients, not "
                          f"{data.dataset!r} (its users bring their own rows)")
