"""The data settings of a run (`DataSettings`, the config's group): which dataset, over how
many clients, split how, and the checks across them; and what they resolve to for a run
(`DataSpec`, `resolve_data`), which is what builds a dataset and keys its cache. The data
package owns both."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

from mcfl.data import registry
from mcfl.data.spec import Partition, parse_partition
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
    synthetic_alpha: float = setting(
        1.0, "Synthetic(alpha, beta)'s alpha, kept at 1: in Li et al.'s generator (FedProx, "
        "Sec. 5.1) a client's W and b are drawn about one mean, which shifts every class's "
        "logit by the same amount, so alpha changes no label; any other value is refused",
        minimum=0)
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


# Datasets whose rows are pooled arrays, normalised and split over clients by a partition.
ARRAY_DATASETS = ("mnist5k", "mnist", "fmnist", "digits", "cifar10", "cifar100")
# Datasets read from files: --data-dir names where (fmnist and mnist5k have a default place).
READS_FILES = ("mnist", "fmnist", "mnist5k", "cifar10", "cifar100", "leaf")
# Recipe defaults (the authors' generators): the FedProx generators split 90/10, Ditto's test
# rows are 1/6 of its train rows (1/7 of all), everything else 80/20; Synthetic 90/10.
RECIPE_TEST_FRACTION = {"fedprox-mnist": 0.1, "ditto-fmnist": 1 / 7}
STANDARDIZED = ("fedprox-mnist", "ditto-fmnist")


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """The clients' data as a run will build it: the settings of `DataSettings` resolved
    (defaults filled in where the dataset fixes them) and checked against each other, every
    one of them used by `mcfl.data.build_dataset`.

    `partition` is the parsed recipe (the dataset's default when none is given; None only for
    a user's dataset given none: its factory's clients as they come, pooled rows IID).
    `test_fraction` is the share used (None: leaf's own test files, fedem-synthetic's 5,000
    test rows a client, a user's factory's split or, for its pooled rows, the recipe's);
    `normalize` the method applied to pooled rows (None where rows are not pooled: Synthetic,
    fedem-synthetic, leaf; a user's dataset: as given, the recipe's for pooled rows).
    `synthetic` is Synthetic's (alpha, beta), None for the other datasets."""

    dataset: str
    clients: Optional[int]
    seed: int
    dataset_args: Any = dataclasses.field(default_factory=dict)
    data_dir: Optional[str] = None
    download: bool = False
    partition: Optional[Partition] = None
    samples_per_client: Optional[int] = None
    test_fraction: Optional[float] = None
    normalize: Optional[str] = None
    synthetic: Optional[tuple[float, float]] = None
    unseen_share: Optional[float] = None

    @property
    def is_users(self) -> bool:
        """Whether the dataset is a user's (registered, or an import path)."""
        return registry.is_user_dataset(self.dataset)

    def with_clients(self, clients: int) -> DataSpec:
        return dataclasses.replace(self, clients=clients)

    def describe(self) -> dict[str, Any]:
        """The spec as JSON values (run.json's plan)."""
        out = dataclasses.asdict(self)
        out["partition"] = None if self.partition is None else str(self.partition)
        out["dataset_args"] = dict(self.dataset_args)
        out["synthetic"] = None if self.synthetic is None else list(self.synthetic)
        return out


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def resolve_data(data: DataSettings, seed: int) -> DataSpec:
    """`data` (checked already, `check_data`) resolved for a run of `seed`: every default the
    dataset fixes filled in, and every setting this dataset does not use refused in one line
    (`ConfigError` naming it, its value and why)."""
    name = data.dataset
    user = registry.is_user_dataset(name)
    arrays = name in ARRAY_DATASETS or name.startswith("tfds:")
    defaults = {f.name: f.default for f in dataclasses.fields(DataSettings)}

    def refuse(key: str, why: str) -> None:
        value = getattr(data, key)
        if value != defaults[key]:
            shown = value if not isinstance(value, bool) else ("on" if value else "off")
            raise ConfigError(f"{_flag(key)} {shown} does not apply to --dataset {name}: {why}")

    if name != "synthetic":
        for key in ("synthetic_alpha", "synthetic_beta"):
            refuse(key, "it shapes Synthetic(alpha, beta) only")
    else:
        # W ~ N(u_k, 1) and b ~ N(u_k, 1) with one u_k ~ N(0, alpha): x W + b gains
        # u_k (sum(x) + 1) in every class, so the argmax labels are alpha's for any alpha.
        refuse("synthetic_alpha", "in Synthetic(alpha, beta) (FedProx's generator) W and b "
                                  "share one mean per client, a shift of every class's logit "
                                  "alike, so alpha changes no label; vary --synthetic-beta")
    if not name.startswith("tfds:"):
        refuse("download", "only tensorflow-datasets (tfds:NAME) may download")
    if name not in READS_FILES and not name.startswith("tfds:"):
        refuse("data_dir", "it reads no files" + (" (its factory finds its own)" if user
                                                  else ""))
    if name in ("synthetic", "fedem-synthetic", "leaf"):
        refuse("normalize", "its rows are not pooled arrays that a recipe normalises")
    data_seed = seed if data.data_seed is None else data.data_seed
    if name == "leaf" and data.test_fraction is None and data.unseen_share is None:
        refuse("data_seed", "leaf's users and their test files are read as they are; the data "
                            "seed draws only a --test-fraction split or --unseen-share's "
                            "held-out clients")
    partition = None
    if data.partition is not None:
        partition = parse_partition(data.partition)
    elif not user:
        partition = parse_partition("natural" if name in NATURAL else "iid")
    test_fraction, normalize = data.test_fraction, data.normalize
    if arrays:
        if test_fraction is None:
            test_fraction = RECIPE_TEST_FRACTION.get(partition.kind, 0.2)
        if normalize is None:
            normalize = "standardize" if partition.kind in STANDARDIZED else "scale"
    elif name == "synthetic" and test_fraction is None:
        test_fraction = 0.1
    data_dir = None if data.data_dir is None else os.path.expanduser(data.data_dir)
    return DataSpec(
        dataset=name, clients=data.clients, seed=data_seed, dataset_args=data.dataset_args,
        data_dir=data_dir, download=data.download, partition=partition,
        samples_per_client=data.samples_per_client, test_fraction=test_fraction,
        normalize=normalize,
        synthetic=(data.synthetic_alpha, data.synthetic_beta) if name == "synthetic" else None,
        unseen_share=data.unseen_share)
