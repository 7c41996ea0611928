"""The dataset registry: a name -> a factory ``(**args) -> FederatedDataset | LabelledArrays``.

``@mcfl.data.register("name")`` adds one; a config may also name a factory by import path,
``"mypkg.data:load"`` (`resolve`), so a user's data need no edit of mcfl. The config's
``dataset_args`` (a JSON object) are the factory's keyword arguments. A factory returns either
pooled rows, `LabelledArrays`, which a run splits over its ``clients`` by its ``partition``
like the built-in array datasets (`mcfl.data.partition_arrays`), or clients already split, a
`FederatedDataset` (`mcfl.data.from_clients`), used as it is. Modelled on the model registry
(`mcfl.models.registry`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Union

from mcfl.data.arrays import LabelledArrays
from mcfl.data.federated import FederatedDataset
from mcfl.data.user import check_pooled
from mcfl.errors import ConfigError, DataError, McflError, first_line
from mcfl.named import Registry

Factory = Callable[..., Union[FederatedDataset, LabelledArrays]]

DATASETS = Registry("dataset")
register = DATASETS.register
names = DATASETS.names
doc = DATASETS.doc


def is_import_path(name: str) -> bool:
    """``module.path:factory`` (``tfds:NAME`` is tensorflow-datasets', not a module)."""
    return ":" in name and not name.startswith("tfds:")


def is_user_dataset(name: str) -> bool:
    """Whether `name` is a user's dataset: a registered name or an import path."""
    return name in DATASETS or is_import_path(name)


def resolve(name: str) -> Factory:
    """The factory `name` stands for: a registered name, or ``module.path:attribute``
    (imported here); anything else is a one-line `ConfigError`."""
    return DATASETS.resolve(name)


def build(name: str, args: Mapping[str, Any]) -> Union[FederatedDataset, LabelledArrays]:
    """What the factory `name` makes of the keyword arguments `args`, checked: a
    `FederatedDataset`, or `LabelledArrays` read as strictly as `from_arrays` reads rows. A
    factory that raises, or returns anything else, is a one-line `DataError` naming it."""
    factory = resolve(name)
    try:
        inspect.signature(factory).bind(**args)
    except TypeError as e:
        raise ConfigError(f"dataset {name!r} cannot take dataset_args {dict(args)!r}: {e}"
                          ) from None
    except ValueError:  # no signature to read (a builtin): the call will say
        pass
    try:
        made = factory(**args)
    except McflError:  # (one of mcfl's own checks, e.g. from_clients', says it already)
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the user's factory is reported
        given = f" with dataset_args {dict(args)!r}" if args else ""
        raise DataError(f"dataset {name!r}: its factory failed{given}: {first_line(e)}"
                        ) from None
    if isinstance(made, LabelledArrays):
        check_pooled(made, f"dataset {name!r}")
    elif not isinstance(made, FederatedDataset):
        raise DataError(f"dataset {name!r}: its factory returned {type(made).__name__}; it "
                        "must return a FederatedDataset (mcfl.data.from_clients) or "
                        "LabelledArrays (pooled rows)")
    return made
