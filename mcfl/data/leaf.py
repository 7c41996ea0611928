"""LEAF datasets with their natural split into clients (FEMNIST writers, CelebA celebrities, ...).

LEAF (Caldas et al., 2018, "LEAF: A Benchmark for Federated Settings", arXiv:1812.01097) and the
FedProx code (Li et al., 2020), which reuses its format for Synthetic(alpha, beta), store a
dataset as JSON files ``data_dir/train/*.json`` and ``data_dir/test/*.json``, each an object::

    {"users": ["f0001_41", ...],
     "num_samples": [154, ...],
     "user_data": {"f0001_41": {"x": [[0.0, 1.0, ...], ...], "y": [4, ...]}, ...}}

``x`` rows are flattened features (784 floats in [0, 1] for FEMNIST, 60 for Synthetic) or, for
CelebA, image file names under ``raw/img_align_celeba``. A user's train rows come from the train
files and its test rows from the test files; a user may be spread over several files.

Files are read one at a time and converted to numpy at once, so the parsed JSON of the whole
dataset (many times the size of the arrays) is never held in memory together.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np
from PIL import Image, UnidentifiedImageError

from mcfl.data.federated import FederatedDataset, from_splits, split_train_test
from mcfl.errors import DataError

_IMAGE_FOLDER = Path("raw") / "img_align_celeba"
_KEYS = ("users", "num_samples", "user_data")


@dataclasses.dataclass
class _SplitRows:
    """The blocks of one split (one block per user per file), concatenated once at the end."""

    x: list[np.ndarray] = dataclasses.field(default_factory=list)
    y: list[np.ndarray] = dataclasses.field(default_factory=list)
    owner: list[np.ndarray] = dataclasses.field(default_factory=list)

    def add(self, block: Optional[tuple[np.ndarray, np.ndarray]], client: int) -> None:
        if block is None:
            return
        x, y = block
        self.x.append(x)
        self.y.append(y)
        self.owner.append(np.full(len(y), client, np.int64))

    def arrays(self, feature_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.y:  # e.g. no test rows for the chosen clients
            return (
                np.zeros((0, *feature_shape), np.float32),
                np.zeros(0, np.int64),
                np.zeros(0, np.int64),
            )
        return np.concatenate(self.x), np.concatenate(self.y), np.concatenate(self.owner)


@dataclasses.dataclass
class _Reader:
    """Turns one user's block of one file into arrays, checking it against earlier blocks."""

    root: Path
    image_size: int
    num_classes: Optional[int] = None
    feature_shape: Optional[tuple[int, ...]] = None
    first_block: str = ""
    image_dir: Optional[Path] = None

    def block(
        self, entry: Any, count: int, user: str, path: Path
    ) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """(x, y) of the block, or None when it has no rows."""
        where = f"user {user!r} in {path}"
        if not isinstance(entry, dict):
            raise DataError(f"user_data[{user!r}] in {path} must be an object with 'x' and 'y'")
        for key in ("x", "y"):
            if key not in entry:
                raise DataError(f"user_data[{user!r}] in {path} has no key {key!r}")
        xs, ys = entry["x"], entry["y"]
        if not isinstance(xs, list) or not isinstance(ys, list):
            raise DataError(f"'x' and 'y' of {where} must be lists")
        if len(xs) != count or len(ys) != count:
            raise DataError(
                f"num_samples says {count} for {where}, but it has {len(xs)} x rows "
                f"and {len(ys)} labels"
            )
        if count == 0:
            return None
        y = _labels(ys, where)
        if self.num_classes is not None and y.max() >= self.num_classes:
            raise DataError(f"label {int(y.max())} of {where} is out of range: this dataset "
                            f"has {self.num_classes} classes (0 to {self.num_classes - 1})")
        x = self._images(xs, where) if xs and isinstance(xs[0], str) else _features(xs, where)
        self._check_shape(x, where)
        return x, y

    def _check_shape(self, x: np.ndarray, where: str) -> None:
        if self.feature_shape is None:
            self.feature_shape, self.first_block = x.shape[1:], where
        elif x.shape[1:] != self.feature_shape:
            raise DataError(
                f"x rows of {where} have shape {x.shape[1:]}, but those of {self.first_block} "
                f"have shape {self.feature_shape}; every row must have the same length"
            )

    def _images(self, names: list, where: str) -> np.ndarray:
        if not all(isinstance(name, str) for name in names):
            raise DataError(f"x of {where} mixes image file names with other values")
        if self.image_dir is None:
            self.image_dir = _find_image_dir(self.root, where)
        return _load_images([self.image_dir / name for name in names], self.image_size)


def load_leaf(
    data_dir: str | os.PathLike,
    num_clients: int | None = None,
    num_classes: int | None = None,
    name: str = "leaf",
    image_size: int = 84,
    test_fraction: Optional[float] = None,
    seed: int = 0,
) -> FederatedDataset:
    """Load a LEAF / FedProx JSON dataset with one client per user, in order of appearance.

    Users are numbered in the order they first appear in the train files (files sorted by name,
    users in listed order); `num_clients` keeps the first that many (None: all). `num_classes`
    defaults to the largest label + 1. Image rows (CelebA) are resized to `image_size` squared
    RGB, float32 in [0, 1]. The files' own train / test split is kept unless `test_fraction`
    is given: then each user's rows of both are pooled and split again, that share of them
    for testing (the FeSEM paper's 80 / 20 per device; LEAF's preprocessing writes 90 / 10 by
    default), drawn with `seed` (`mcfl.data.federated.split_train_test`).
    """
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"LEAF data directory {root} does not exist")
    if num_clients is not None and num_clients < 1:
        raise DataError(f"num_clients must be at least 1, got {num_clients}")
    reader = _Reader(root, image_size, num_classes)
    train_files, test_files = _json_files(root / "train"), _json_files(root / "test")
    users, train = _read_train(train_files, reader, num_clients)
    chosen = users if num_clients is None else users[:num_clients]
    test = _read_test(test_files, reader, users, len(chosen), root / "train")
    feature_shape = reader.feature_shape or (0,)
    x_train, y_train, owner_train = train.arrays(feature_shape)
    x_test, y_test, owner_test = test.arrays(feature_shape)
    _check_every_client_trains(owner_train, chosen)
    if num_classes is None:
        num_classes = int(max(y_train.max(), y_test.max(initial=-1))) + 1
    if test_fraction is not None:
        x = np.concatenate([x_train, x_test])
        y = np.concatenate([y_train, y_test])
        owner = np.concatenate([owner_train, owner_test])
        train, test = split_train_test(owner, len(chosen), test_fraction,
                                       np.random.default_rng(seed))
        (x_train, y_train, owner_train), (x_test, y_test, owner_test) = (
            (x[rows], y[rows], owner[rows]) for rows in (train, test))
    return from_splits(
        name,
        (x_train, y_train, owner_train),
        (x_test, y_test, owner_test),
        len(chosen),
        num_classes,
        client_ids=chosen,
    )


def _read_train(
    files: list[Path], reader: _Reader, num_clients: Optional[int]
) -> tuple[list[str], _SplitRows]:
    """All train users in order of appearance, and the rows of the first `num_clients` of them."""
    users: list[str] = []
    index: dict[str, int] = {}
    rows = _SplitRows()
    for path in files:
        document = _read_json(path)
        for user, count in _listed_users(document, path):
            if user not in index:
                index[user] = len(users)
                users.append(user)
            client = index[user]
            if num_clients is not None and client >= num_clients:
                continue  # not chosen: skip the (possibly costly) conversion
            rows.add(reader.block(document["user_data"][user], count, user, path), client)
    if not users:
        raise DataError(f"the train files in {files[0].parent} list no users (every 'users' "
                        "list is empty); a LEAF dataset needs at least one user with rows")
    if num_clients is not None and num_clients > len(users):
        raise DataError(
            f"asked for {num_clients} clients, but the train files hold only {len(users)} users"
        )
    return users, rows


def _read_test(
    files: list[Path], reader: _Reader, users: list[str], num_chosen: int, train_dir: Path
) -> _SplitRows:
    """The test rows of the first `num_chosen` train users; every test user must be a train user."""
    index = {user: client for client, user in enumerate(users)}
    rows = _SplitRows()
    for path in files:
        document = _read_json(path)
        for user, count in _listed_users(document, path):
            if user not in index:
                raise DataError(
                    f"user {user!r} in {path} has test data but does not appear in {train_dir}"
                )
            if index[user] >= num_chosen:
                continue
            rows.add(reader.block(document["user_data"][user], count, user, path), index[user])
    return rows


def _json_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise DataError(f"LEAF folder {folder} does not exist")
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"LEAF folder {folder} holds no .json file")
    return files


def _read_json(path: Path) -> dict:
    """The parsed file, checked to be an object with the three LEAF keys."""
    try:
        with open(path, "rb") as handle:
            document = json.load(handle)
    except json.JSONDecodeError as err:
        raise DataError(
            f"{path} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}"
        ) from None
    except UnicodeDecodeError as err:
        raise DataError(f"{path} is not valid JSON: not UTF-8 text ({err.reason})") from None
    if not isinstance(document, dict):
        raise DataError(f"{path} must hold a JSON object with keys {', '.join(_KEYS)}")
    for key in _KEYS:
        if key not in document:
            raise DataError(f"{path} has no key {key!r} (expected keys: {', '.join(_KEYS)})")
    return document


def _listed_users(document: dict, path: Path) -> list[tuple[str, int]]:
    """(user, num_samples) pairs of a file, each user checked to have an entry in user_data."""
    users, counts, data = document["users"], document["num_samples"], document["user_data"]
    if not isinstance(users, list) or not isinstance(counts, list) or not isinstance(data, dict):
        raise DataError(
            f"in {path}, 'users' and 'num_samples' must be lists, 'user_data' an object"
        )
    if len(counts) != len(users):
        raise DataError(f"{path} lists {len(users)} users but {len(counts)} num_samples")
    for user, count in zip(users, counts):
        if not isinstance(user, str):
            raise DataError(f"user names in {path} must be strings, got {user!r}")
        if user not in data:
            raise DataError(f"user {user!r} listed in {path} has no entry in 'user_data'")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise DataError(
                f"num_samples of user {user!r} in {path} must be a count, got {count!r}"
            )
    if len(set(users)) != len(users):
        twice = next(user for i, user in enumerate(users) if user in users[:i])
        raise DataError(f"user {twice!r} is listed twice in {path}")
    listed = set(users)
    unlisted = [user for user in data if user not in listed]
    if unlisted:  # rows that would be silently dropped
        raise DataError(f"'user_data' in {path} holds user(s) not listed in 'users': "
                        f"{', '.join(map(repr, unlisted[:3]))}; list every user once")
    return list(zip(users, counts))


def _labels(values: list, where: str) -> np.ndarray:
    """Integer labels; LEAF CelebA stores some as booleans, read as 0/1."""
    bad = [v for v in values if not isinstance(v, int) or not 0 <= v < 2**31][:1]
    if bad:  # (a bool is an int)
        bad = bad[0]
        raise DataError(f"labels of {where} must be integers from 0 to 2^31 - 1, got {bad!r}")
    return np.asarray(values, np.int64)


def _features(rows: list, where: str) -> np.ndarray:
    """Rows of numbers as float32 [N, D]."""
    try:
        x = np.asarray(rows, np.float32)
    except (ValueError, TypeError):
        lengths = sorted({len(r) for r in rows if isinstance(r, list)})
        if len(lengths) > 1:
            raise DataError(
                f"x rows of {where} have different lengths ({lengths[0]} to {lengths[-1]})"
            ) from None
        raise DataError(f"x of {where} must be lists of numbers") from None
    if x.ndim != 2:
        raise DataError(f"x of {where} must be lists of numbers, got shape {x.shape}")
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise DataError(f"x of {where} holds NaN or infinity (row {row}: "
                        f"{x[row][~np.isfinite(x[row])][0]}); features must be finite numbers")
    return x


def _find_image_dir(root: Path, where: str) -> Path:
    candidates = (root / _IMAGE_FOLDER, root.parent / _IMAGE_FOLDER)
    for folder in candidates:
        if folder.is_dir():
            return folder
    raise DataError(
        f"x of {where} names image files, but no image folder exists "
        f"(looked for {candidates[0]} and {candidates[1]})"
    )


def _load_images(paths: list[Path], image_size: int) -> np.ndarray:
    """RGB images resized to image_size x image_size, float32 in [0, 1], [N, S, S, 3]."""
    images = np.empty((len(paths), image_size, image_size, 3), np.float32)
    for i, path in enumerate(paths):
        try:
            with Image.open(path) as image:
                rgb = image.convert("RGB").resize(
                    (image_size, image_size), Image.Resampling.BILINEAR
                )
        except FileNotFoundError:
            raise DataError(f"image file {path} does not exist") from None
        except (UnidentifiedImageError, OSError) as err:
            raise DataError(f"image file {path} cannot be read: {err}") from None
        images[i] = np.asarray(rgb, np.float32)
    images /= 255.0
    return images


def _check_every_client_trains(owner_train: np.ndarray, users: list[str]) -> None:
    counts = np.bincount(owner_train, minlength=len(users))
    empty = [users[i] for i in np.flatnonzero(counts == 0)[:5]]
    if empty:
        raise DataError(f"user(s) {', '.join(map(repr, empty))} have no training rows")

