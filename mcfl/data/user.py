"""Data users bring: their own clients' rows (`from_clients`, `from_arrays`), split into
train and test rows as the loaders split theirs (stratified by label, seeded:
`mcfl.data.federated.split_train_test`) unless the user gives the split; and planted clusters
on any federated dataset (`plant`).

Input is read strictly, as the file loaders read theirs (`mcfl.data.leaf`): each problem is a
one-line `DataError` naming the client (its id when `client_ids` are given, else its index)
and the value. What is accepted:

* features ``x``: a numeric array [n_i, *feature_shape] (integers or floats; booleans and
  complex numbers are refused), of one feature shape across clients, every value finite; used
  as given, cast to float32: scale them yourself (the loaders map uint8 pixels to [0, 1]).
* labels ``y``: [n_i] class indices >= 0 and < `num_classes` (default: the largest label + 1,
  at most `MAX_CLASSES`). Integer arrays, or float arrays of whole numbers (1.0 is class 1, as
  numpy reads a CSV of labels); 1.5, NaN and booleans are refused.
* `client_ids`: distinct non-empty strings, one per client. `true_cluster`: one integer >= 0
  per client (the planted ground truth, scored by ARI).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from mcfl.data import partition, shifts
from mcfl.data.arrays import LabelledArrays
from mcfl.data.federated import MAX_CLASSES, FederatedDataset, from_owner, from_splits
from mcfl.data.shifts import SHIFT_KINDS
from mcfl.data.spec import PLANTED_KINDS, parse_partition
from mcfl.errors import DataError


def from_clients(
    clients: Optional[Sequence] = None,
    *,
    train: Optional[Sequence] = None,
    test: Optional[Sequence] = None,
    num_classes: Optional[int] = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    client_ids: Optional[Sequence[str]] = None,
    true_cluster=None,
    name: str = "user",
) -> FederatedDataset:
    """A federated dataset from each client's own rows.

    ``clients=[(x_0, y_0), (x_1, y_1), ...]``, one (x, y) pair per client: each client's rows
    are split into train and test, `test_fraction` of them (about; stratified by label, and
    every label a client holds stays in its training rows), seeded by `seed`. Or, when the
    split is the user's, ``train=[...]`` and ``test=[...]``, one pair per client in each
    (`test_fraction` is then not used; a client may have no test rows, not no train rows).
    """
    if clients is not None and (train is not None or test is not None):
        raise DataError("give clients= (split here) or train= and test= (split already), "
                        "not both")
    if clients is None and (train is None or test is None):
        given = ("train= without test=" if train is not None else
                 "test= without train=" if test is not None else "neither")
        raise DataError(f"give clients=[(x, y), ...] (one pair per client) or both train= and "
                        f"test=; got {given}")
    _check_split(name, test_fraction, seed)
    if clients is not None:
        count = _count(clients, "clients")
        ids = _client_ids(client_ids, count)
        x, y, owner = _rows(clients, ids, "client", empty_ok=False)
        classes = _num_classes(num_classes, y, owner, ids)
        true = _true_cluster(true_cluster, count)
        return from_owner(name, x, y, owner, count, classes, test_fraction,
                          np.random.default_rng(seed), ids, true, stratify=True)
    count = _count(train, "train")
    if _count(test, "test") != count:
        raise DataError(f"train= has {count} clients but test= has {len(test)}; give one "
                        "(x, y) pair per client in each")
    ids = _client_ids(client_ids, count)
    train_rows = _rows(train, ids, "train rows of client", empty_ok=False)
    test_rows = _rows(test, ids, "test rows of client", empty_ok=True,
                      feature_shape=train_rows[0].shape[1:])
    classes = _num_classes(num_classes, np.concatenate([train_rows[1], test_rows[1]]),
                           np.concatenate([train_rows[2], test_rows[2]]), ids)
    return from_splits(name, train_rows, test_rows, count, classes, ids,
                       _true_cluster(true_cluster, count))


def from_arrays(
    x,
    y,
    client_of_row,
    *,
    num_classes: Optional[int] = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    client_ids: Optional[Sequence[str]] = None,
    true_cluster=None,
    name: str = "user",
) -> FederatedDataset:
    """A federated dataset from one array of rows and the client of each: ``client_of_row[j]``
    in [0, C) owns row j, where C is ``len(client_ids)`` if given, else the largest index + 1;
    every client needs a row. Each client's rows are split as `from_clients` splits them; an
    error names the row (of `x`) and its client."""
    _check_split(name, test_fraction, seed)
    owner = _owners(client_of_row, client_ids)
    count = len(client_ids) if isinstance(client_ids, (list, tuple)) else int(owner.max()) + 1
    ids = _client_ids(client_ids, count)

    def place(row: int) -> str:
        if row >= len(owner):  # (lengths are compared once y is read)
            return f"row {row}"
        return f"client {_name(ids, int(owner[row]))}, row {row}"

    x = _features(x, "from_arrays")
    y = _labels(y, "from_arrays", place)
    if not len(x) == len(y) == len(owner):
        raise DataError(f"from_arrays: x has {len(x)} rows, y {len(y)} labels and "
                        f"client_of_row {len(owner)} entries; give one of each per row")
    _check_finite(x, place)
    empty = np.flatnonzero(np.bincount(owner, minlength=count) == 0)
    if empty.size:
        raise DataError(f"client {_name(ids, int(empty[0]))} has no rows (no entry of "
                        f"client_of_row names it); every client needs at least one")
    classes = _num_classes(num_classes, y, owner, ids)
    return from_owner(name, x, y, owner, count, classes, test_fraction,
                      np.random.default_rng(seed), ids, _true_cluster(true_cluster, count),
                      stratify=True)


def plant(dataset: FederatedDataset, recipe: str, seed: int = 0) -> FederatedDataset:
    """`dataset` with planted clusters (IFCA's protocol, Ghosh et al., 2020), seeded by `seed`:
    its clients are dealt into R balanced clusters at random, its returned `true_cluster`, and
    every row, train and test, is transformed by its client's cluster r (`partition.plant_rows`;
    cluster 0 is left as it is): ``rotated:R`` turns images by r * 360 / R degrees (square
    ones: features [H, H], [H, H, C], or H*H values turned as an H x H image), ``permuted:R``
    relabels by the r-th of R label permutations, ``label_swap:R`` exchanges the r-th
    cluster's pairs of labels (`partition.label_swaps`). The shifts ``shift_x:R@S``,
    ``shift_y_given_x:R@S`` and ``shift_x_given_y:R@S`` (`mcfl.data.shifts`, joined with + if
    wanted) transform rows the same way; ``shift_y`` decides which rows clients hold, so it
    cannot apply to clients already split. A dataset that already has planted clusters is
    refused."""
    if not isinstance(dataset, FederatedDataset):
        raise DataError(f"plant needs a FederatedDataset (e.g. from from_clients), got "
                        f"{type(dataset).__name__}")
    part = parse_partition(recipe) if isinstance(recipe, str) else None
    if part is None or not part.planted or recipe.count("+") + 1 > len(part.planted):
        kinds = ", ".join(f"{kind}:R" + ("@S" if kind in SHIFT_KINDS else "")
                          for kind in PLANTED_KINDS)
        raise DataError(f"plant takes planted recipes alone ({kinds}), got {recipe!r}")
    if part.planted_kind("shift_y"):
        raise DataError(f"shift_y decides which rows each client holds, so it cannot be planted "
                        f"on clients already split (dataset {dataset.name!r}); give pooled rows "
                        "(LabelledArrays) and a partition instead")
    if dataset.true_cluster is not None:
        raise DataError(f"dataset {dataset.name!r} already has planted clusters (true_cluster); "
                        "plant clusters on a dataset without them")
    _check_seed(seed)
    recipe = str(part).removesuffix("+iid")
    turns = part.planted_kind("rotated") or part.planted_kind("shift_x") \
        or part.planted_kind("shift_x_given_y")
    shape = _rotatable_shape(dataset, recipe) if turns else None
    rng = np.random.default_rng(seed)
    true = partition.planted_cluster_ids(dataset.num_clients, part.clusters, rng, part.shares)
    a, count = dataset.arrays, dataset.num_clients
    # Both splits at once: a label map is drawn once for a cluster's train and test rows.
    owner = np.concatenate([np.asarray(a.train_owner), np.asarray(a.test_owner)]).astype(int)
    held = owner < count  # (rows a distribution shift took from every client: none as built)
    x = np.concatenate([np.asarray(a.x_train), np.asarray(a.x_test)])[held]
    y = np.concatenate([np.asarray(a.y_train), np.asarray(a.y_test)]).astype(np.int64)[held]
    cut = int(held[:len(a.y_train)].sum())
    owner = owner[held]
    images = x.reshape(len(x), *shape) if shape is not None else x
    if part.shifts:
        images, y = shifts.shift_rows(part.shifts, images, y, true[owner], part.clusters,
                                      dataset.num_classes, rng)
    else:
        images, y = partition.plant_rows(part.planted[0].kind, images, y, true[owner],
                                         part.clusters, dataset.num_classes, rng)
    x = images.reshape(x.shape)
    return from_splits(f"{dataset.name}/{recipe}", (x[:cut], y[:cut], owner[:cut]),
                       (x[cut:], y[cut:], owner[cut:]), count, dataset.num_classes,
                       dataset.client_ids, true)


def _rotatable_shape(dataset: FederatedDataset, recipe: str) -> tuple[int, ...]:
    """The image shape rows are turned in: [H, H], [H, H, C], or H x H for H*H flat values."""
    shape = dataset.feature_shape
    if len(shape) == 1 and math.isqrt(shape[0]) ** 2 == shape[0]:
        return (math.isqrt(shape[0]),) * 2
    if len(shape) in (2, 3) and shape[0] == shape[1]:
        return shape
    raise DataError(f"{recipe} turns square images: features [H, H], [H, H, C] or H*H values; "
                    f"dataset {dataset.name!r} has features of shape {shape}")


def check_pooled(arrays: LabelledArrays, who: str) -> None:
    """Pooled rows a dataset factory returned (`mcfl.data.registry`), read as strictly as
    `from_arrays` reads its rows: numeric features of at least two dimensions, integer labels in
    [0, num_classes), one label and one `official_train` flag per row."""
    if not _is_int(arrays.num_classes) or not 1 <= arrays.num_classes <= MAX_CLASSES:
        raise DataError(f"{who}: num_classes must be an integer from 1 to {MAX_CLASSES}, got "
                        f"{arrays.num_classes!r}")
    x = np.asarray(arrays.x)
    _numeric(x, who, arrays.x)
    y = _labels(arrays.y, who, _row_of(who))
    flags = np.asarray(arrays.official_train)
    if flags.dtype != bool or not len(x) == len(y) == len(flags):
        raise DataError(f"{who}: x, y and official_train (booleans) must have one entry per "
                        f"row, got {len(x)} rows, {len(y)} labels and {len(flags)} "
                        f"{flags.dtype} flags")
    if not len(y):
        raise DataError(f"{who} has no rows")
    if y.max() >= arrays.num_classes:
        row = int(np.argmax(y))
        raise DataError(f"{who}: labels must lie in [0, {arrays.num_classes}) (num_classes), "
                        f"got {y[row]} (row {row})")


def _name(ids: Optional[tuple[str, ...]], index: int) -> str:
    return repr(ids[index]) if ids is not None else str(index)


def _row_of(who: str) -> Callable[[int], str]:
    return lambda row: f"{who}, row {row}"


def _kind(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    return type(value).__name__


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_split(name, test_fraction, seed) -> None:
    """The arguments of a split besides the rows: a name, a test share, a seed."""
    if not isinstance(name, str) or not name:
        raise DataError(f"name must be a non-empty string, got {name!r}")
    if isinstance(test_fraction, bool) or not isinstance(
            test_fraction, (int, float, np.integer, np.floating)) or not 0 < test_fraction < 1:
        raise DataError(f"test_fraction must be a number in (0, 1), got {test_fraction!r}")
    _check_seed(seed)


def _check_seed(seed) -> None:
    if not _is_int(seed) or seed < 0:
        raise DataError(f"seed must be an integer >= 0, got {seed!r}")


def _count(pairs, what: str) -> int:
    if not isinstance(pairs, (list, tuple)):
        raise DataError(f"{what} must be a list of (x, y) pairs, one per client, got "
                        f"{_kind(pairs)}")
    if not pairs:
        raise DataError(f"{what} is an empty list; give one (x, y) pair per client")
    return len(pairs)


def _client_ids(client_ids, count: int) -> Optional[tuple[str, ...]]:
    if client_ids is None:
        return None
    if not isinstance(client_ids, (list, tuple)) or len(client_ids) != count:
        raise DataError(f"client_ids must be a list of {count} names, one per client, got "
                        f"{_kind(client_ids)}")
    bad = next((i for i, c in enumerate(client_ids) if not isinstance(c, str) or not c), None)
    if bad is not None:
        raise DataError(f"client_ids must be non-empty strings, got {client_ids[bad]!r} "
                        f"(client {bad})")
    twice = next((c for i, c in enumerate(client_ids) if c in client_ids[:i]), None)
    if twice is not None:
        raise DataError(f"client_ids names {twice!r} twice; give every client its own name")
    return tuple(client_ids)


def _owners(client_of_row, client_ids) -> np.ndarray:
    owner = np.asarray(client_of_row)
    if owner.ndim != 1 or owner.dtype == bool or not np.issubdtype(owner.dtype, np.integer):
        raise DataError(f"client_of_row must be a 1-D array of client indices (integers), got "
                        f"{_kind(client_of_row)} of dtype {owner.dtype} and shape {owner.shape}")
    if not owner.size:
        raise DataError("client_of_row is empty; give the client of every row")
    limit = len(client_ids) if isinstance(client_ids, (list, tuple)) else None
    bad = np.flatnonzero((owner < 0) | (owner >= (limit if limit is not None else np.inf)))
    if bad.size:
        allowed = f"in [0, {limit}) (client_ids lists {limit})" if limit is not None else ">= 0"
        raise DataError(f"client_of_row must hold client indices {allowed}, got "
                        f"{owner[bad[0]]} (row {bad[0]})")
    return owner.astype(np.int64)


def _numeric(x: np.ndarray, who: str, given: Any) -> None:
    """Refuse features that are not a numeric array of rows."""
    if x.dtype == bool or not (np.issubdtype(x.dtype, np.integer)
                               or np.issubdtype(x.dtype, np.floating)):
        what = f"dtype {x.dtype}" if x.dtype != object else _kind(given)
        hint = "; cast 0/1 features with x.astype(np.float32)" if x.dtype == bool else ""
        raise DataError(f"{who}: x must be a numeric array [rows, *features] (integers or "
                        f"floats), got {what}{hint}")
    if x.ndim < 2:
        raise DataError(f"{who}: x must be [rows, *features] (at least 2-D), got shape "
                        f"{x.shape}; one feature per row is shape [rows, 1]")


def _features(x, who: str) -> np.ndarray:
    """Features as float32 [n, *feature_shape]."""
    try:
        array = np.asarray(x)
    except ValueError:  # rows of different lengths
        raise DataError(f"{who}: x must be a numeric array [rows, *features], got rows of "
                        "different shapes") from None
    _numeric(array, who, x)
    with np.errstate(over="ignore"):  # a value beyond float32's range becomes inf: refused
        return np.asarray(array, np.float32)


def _check_finite(x: np.ndarray, place: Callable[[int], str]) -> None:
    """Refuse NaN and infinity (float32 `x`: a float64 value beyond its range is one)."""
    finite = np.isfinite(x.reshape(len(x), -1)).all(axis=1) if x.size else np.ones(0, bool)
    if not finite.all():
        raise DataError(f"{place(int(np.flatnonzero(~finite)[0]))}: x holds NaN or infinity "
                        "(or a value beyond float32's range); features must be finite numbers")


def _labels(y, who: str, place: Callable[[int], str]) -> np.ndarray:
    """Labels as int64 class indices (see the module's docstring for what is accepted)."""
    try:
        labels = np.asarray(y)
    except ValueError:
        labels = np.asarray(None)
    if labels.ndim != 1:
        raise DataError(f"{who}: y must be a 1-D array of labels, one per row, got "
                        f"{_kind(y)} of shape {labels.shape}")
    if labels.dtype == bool:
        raise DataError(f"{who}: labels must be integers (class indices), got booleans; write "
                        "the class as 0 or 1")
    if np.issubdtype(labels.dtype, np.floating):
        odd = np.flatnonzero(~np.isfinite(labels) | (labels != np.round(labels)))
        if odd.size:
            raise DataError(f"{place(int(odd[0]))}: labels must be integers (class indices), "
                            f"got {labels[odd[0]]}")
    elif not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{who}: labels must be integers (class indices), got dtype "
                        f"{labels.dtype}")
    bad = np.flatnonzero((labels < 0) | (labels >= MAX_CLASSES))
    if bad.size:
        raise DataError(f"{place(int(bad[0]))}: labels must be class indices from 0 to "
                        f"{MAX_CLASSES - 1}, got {labels[bad[0]]}")
    return labels.astype(np.int64)


def _rows(pairs: Sequence, ids, what: str, empty_ok: bool,
          feature_shape: Optional[tuple[int, ...]] = None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, owner) of every client's (x, y) pair, concatenated in client order; `what`
    names a client in messages ("client", "test rows of client")."""
    xs, ys = [], []
    first = None if feature_shape is None else "the train rows"
    for i, pair in enumerate(pairs):
        who = f"{what} {_name(ids, i)}"
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise DataError(f"{who} must be an (x, y) pair of arrays, got {_kind(pair)}")
        y = _labels(pair[1], who, _row_of(who))
        if empty_ok and isinstance(pair[0], (list, tuple)) and not pair[0]:
            x = np.zeros((0, *(feature_shape or ())), np.float32)  # no rows: ([], []) will do
        else:
            x = _features(pair[0], who)
        if len(x) != len(y):
            raise DataError(f"{who}: x has {len(x)} rows but y has {len(y)} labels; give one "
                            "label per row")
        if not len(y) and not empty_ok:
            raise DataError(f"{who} has no rows; every client needs at least one"
                            + (" training row" if what.startswith("train") else ""))
        if feature_shape is None:
            feature_shape, first = x.shape[1:], who
        elif x.shape[1:] != feature_shape:
            raise DataError(f"{who}: features have shape {x.shape[1:]}, but those of {first} "
                            f"have {feature_shape}; every client's must match")
        _check_finite(x, _row_of(who))
        xs.append(x)
        ys.append(y)
    owner = np.repeat(np.arange(len(ys)), [len(y) for y in ys])
    return np.concatenate(xs), np.concatenate(ys), owner


def _num_classes(num_classes, y: np.ndarray, owner: np.ndarray, ids) -> int:
    """`num_classes`, checked against the labels, or the largest label + 1."""
    if num_classes is None:
        return int(y.max()) + 1
    if not _is_int(num_classes) or not 1 <= num_classes <= MAX_CLASSES:
        raise DataError(f"num_classes must be an integer from 1 to {MAX_CLASSES}, got "
                        f"{num_classes!r}")
    if y.size and y.max() >= num_classes:
        row = int(np.argmax(y))
        raise DataError(f"client {_name(ids, int(owner[row]))}: labels must lie in "
                        f"[0, {num_classes}) (num_classes={num_classes}), got {y[row]}")
    return int(num_classes)


def _true_cluster(true_cluster, count: int) -> Optional[np.ndarray]:
    if true_cluster is None:
        return None
    array = np.asarray(true_cluster)
    if array.shape != (count,):
        raise DataError(f"true_cluster must hold one cluster id per client ({count}), got shape "
                        f"{array.shape}")
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer) or (array < 0).any():
        raise DataError(f"true_cluster must be integers >= 0 (cluster ids), got "
                        f"{array.tolist()[:8]}")
    return array.astype(np.int64)
