"""LEAF datasets with their natural split into clients (FEMNIST writers, CelebA celebrities,
Shakespeare speaking roles, ...).

LEAF (Caldas et al., 2018, "LEAF: A Benchmark for Federated Settings", arXiv:1812.01097) and the
FedProx code (Li et al., 2020), which reuses its format for Synthetic(alpha, beta), store a
dataset as JSON files ``data_dir/train/*.json`` and ``data_dir/test/*.json``, each an object::

    {"users": ["f0001_41", ...],
     "num_samples": [154, ...],
     "user_data": {"f0001_41": {"x": [[0.0, 1.0, ...], ...], "y": [4, ...]}, ...}}

``x`` rows are flattened features (784 floats in [0, 1] for FEMNIST, 60 for Synthetic), or
strings: for CelebA, image file names under ``raw/img_align_celeba`` (strings ending in .jpg,
.jpeg or .png); for Shakespeare, any other strings: lines of 80 characters, each labelled by the
next character, read as indices into LEAF's 80-character vocabulary (80 classes; see
`mcfl.data.leaf_strings`). A user's train rows come from the train files and its test rows
from the test files; a user may be spread over several files, and may have no test rows (not
the reverse). Other keys (LEAF's ``hierarchies``) are ignored.

Files are read strictly (UTF-8 JSON, no key twice in an object): ``users`` distinct non-empty
strings; ``num_samples`` the length of each user's ``x`` and ``y``; ``x`` rows flat lists of
finite numbers (no string, null or boolean), all of one length, or all strings of one kind
(text rows of one length, of the vocabulary's characters); labels ``y`` integers >= 0 (``1.0``,
as LEAF's CelebA preprocessing writes, is 1; a boolean is refused), for text single characters.
Anything else is a `DataError` naming the file, the user and the value.

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

from mcfl.data.federated import MAX_CLASSES, FederatedDataset, from_splits, split_train_test
from mcfl.data.leaf_strings import (
    IMAGES,
    NUM_LETTERS,
    TEXT,
    character_labels,
    find_image_dir,
    load_images,
    row_kind,
    text_rows,
)
from mcfl.errors import DataError

_KEYS = ("users", "num_samples", "user_data")
_BOM = b"\xef\xbb\xbf"
_MAX_LABEL = MAX_CLASSES - 1


def _shown(value: Any) -> str:
    """A value read from JSON as its JSON text (null, true, "1"), cut to 40 characters."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclasses.dataclass
class _SplitRows:
    """The blocks of one split (one block per user per file), concatenated once at the end."""

    x: list[np.ndarray] = dataclasses.field(default_factory=list)
    y: list[np.ndarray] = dataclasses.field(default_factory=list)
    owner: list[np.ndarray] = dataclasses.field(default_factory=list)

    def add(self, block: Optional[tuple[np.ndarray, np.ndarray]], client: int) -> None:
        if block is not None:
            self.x.append(block[0])
            self.y.append(block[1])
            self.owner.append(np.full(len(block[1]), client, np.int64))

    def arrays(self, feature_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.y:  # e.g. no test rows for the chosen clients
            return np.zeros((0, *feature_shape), np.float32), *np.zeros((2, 0), np.int64)
        return np.concatenate(self.x), np.concatenate(self.y), np.concatenate(self.owner)


@dataclasses.dataclass
class _Reader:
    """Turns one user's block of one file into arrays, checking it against earlier blocks."""

    root: Path
    image_size: int
    num_classes: Optional[int] = None
    feature_shape: Optional[tuple[int, ...]] = None
    first_block: str = ""
    kind: str = ""  # of the first block's rows (`leaf_strings.row_kind`)
    image_dir: Optional[Path] = None

    def block(self, entry: Any, count: int, user: str, path: Path,
              booleans: bool = True) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """(x, y) of the block, or None when it has no rows; `booleans`: whether the file's
        text holds a JSON boolean (if not, rows need no search for one)."""
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
            raise DataError(f"num_samples says {count} for {where}, but it has {len(xs)} x rows "
                            f"and {len(ys)} labels")
        if count == 0:
            return None
        kind = row_kind(xs[0])
        if self.kind and kind != self.kind:
            raise DataError(f"x of {where} holds {kind}, but that of {self.first_block} holds "
                            f"{self.kind}; every row of a dataset must be of one kind")
        y = character_labels(ys, where) if kind == TEXT else _labels(ys, where)
        if self.num_classes is not None and y.max() >= self.num_classes:
            raise DataError(f"label {int(y.max())} of {where} is out of range: this dataset "
                            f"has {self.num_classes} classes (0 to {self.num_classes - 1})")
        x = (text_rows(xs, where) if kind == TEXT else self._images(xs, where) if kind == IMAGES
             else _features(xs, where, booleans))
        self._check_shape(x, where, kind)
        return x, y

    def _check_shape(self, x: np.ndarray, where: str, kind: str) -> None:
        if self.feature_shape is None:
            self.feature_shape, self.first_block, self.kind = x.shape[1:], where, kind
        elif x.shape[1:] != self.feature_shape:
            raise DataError(f"x rows of {where} have shape {x.shape[1:]}, but those of "
                            f"{self.first_block} have shape {self.feature_shape}; every row must "
                            "have the same length")

    def _images(self, names: list, where: str) -> np.ndarray:
        if not all(isinstance(name, str) for name in names):
            raise DataError(f"x of {where} mixes image file names with other values")
        if self.image_dir is None:
            self.image_dir = find_image_dir(self.root, where)
        return load_images([self.image_dir / name for name in names], self.image_size)


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
    defaults to the largest label + 1 (80 for text rows, LEAF Shakespeare's vocabulary). Image
    rows (CelebA) are resized to `image_size` squared RGB, float32 in [0, 1]. The files' own
    train / test split is kept unless `test_fraction` is given: then each user's rows of both
    are pooled and split again, that share of them for testing (the FeSEM paper's 80 / 20 per
    device; LEAF's preprocessing writes 90 / 10 by default), drawn with `seed`
    (`mcfl.data.federated.split_train_test`).
    """
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"LEAF data directory {root} " + (
            "is a file; name the folder holding train/ and test/" if root.exists()
            else "does not exist"))
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
    _check_every_client_trains(owner_train, chosen, root / "train")
    if num_classes is None:
        num_classes = NUM_LETTERS if reader.kind == TEXT else int(
            max(y_train.max(), y_test.max(initial=-1))) + 1
    if test_fraction is not None:
        x = np.concatenate([x_train, x_test])
        y = np.concatenate([y_train, y_test])
        owner = np.concatenate([owner_train, owner_test])
        train, test = split_train_test(owner, len(chosen), test_fraction,
                                       np.random.default_rng(seed))
        (x_train, y_train, owner_train), (x_test, y_test, owner_test) = (
            (x[rows], y[rows], owner[rows]) for rows in (train, test))
    return from_splits(name, (x_train, y_train, owner_train), (x_test, y_test, owner_test),
                       len(chosen), num_classes, client_ids=chosen)


def _read_train(files: list[Path], reader: _Reader,
                num_clients: Optional[int]) -> tuple[list[str], _SplitRows]:
    """All train users in order of appearance, and the rows of the first `num_clients` of them."""
    users: list[str] = []
    index: dict[str, int] = {}
    rows = _SplitRows()
    for path in files:
        document, booleans = _read_json(path)
        for user, count in _listed_users(document, path):
            if user not in index:
                index[user] = len(users)
                users.append(user)
            client = index[user]
            if num_clients is not None and client >= num_clients:
                continue  # not chosen: skip the (possibly costly) conversion
            rows.add(reader.block(document["user_data"][user], count, user, path, booleans),
                     client)
    if not users:
        raise DataError(f"the train files in {files[0].parent} list no users (every 'users' "
                        "list is empty); a LEAF dataset needs at least one user with rows")
    if num_clients is not None and num_clients > len(users):
        raise DataError(f"asked for {num_clients} clients (--clients), but the train files in "
                        f"{files[0].parent} hold only {len(users)} users; give at most "
                        f"{len(users)}, or leave --clients out for all of them")
    return users, rows


def _read_test(files: list[Path], reader: _Reader, users: list[str], num_chosen: int,
               train_dir: Path) -> _SplitRows:
    """The test rows of the first `num_chosen` train users; every test user must be a train user."""
    index = {user: client for client, user in enumerate(users)}
    rows = _SplitRows()
    for path in files:
        document, booleans = _read_json(path)
        for user, count in _listed_users(document, path):
            if user not in index:
                raise DataError(f"user {user!r} in {path} has test data but does not appear in "
                                f"{train_dir}; every test user needs train rows too")
            if index[user] >= num_chosen:
                continue
            rows.add(reader.block(document["user_data"][user], count, user, path, booleans),
                     index[user])
    return rows


def _json_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise DataError(f"LEAF folder {folder} " + ("is a file; LEAF data needs a train/ and a "
                        "test/ folder of .json files" if folder.exists() else "does not exist"))
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"LEAF folder {folder} holds no .json file")
    return files


class _RepeatedKey(Exception):
    """A JSON object gives a key twice (json would keep the last, silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _RepeatedKey(next(k for i, k in enumerate(keys) if k in keys[:i]))
    return dict(pairs)


def _read_json(path: Path) -> tuple[dict, bool]:
    """The parsed file, checked to be an object with the three LEAF keys, and whether its text
    holds ``true`` or ``false`` anywhere (where not, no row can hold a boolean)."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DataError(f"{path} cannot be read: {err.strerror or err}") from None
    booleans = b"true" in raw or b"false" in raw
    try:
        text = raw[len(_BOM):].decode() if raw.startswith(_BOM) else raw.decode()
        del raw
        document = json.loads(text, object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as err:
        raise DataError(f"{path} is not valid JSON: not UTF-8 text ({err.reason} at byte "
                        f"{err.start}); LEAF files are UTF-8") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{path} is not valid JSON: {err.msg} at line {err.lineno}, column "
                        f"{err.colno}") from None
    except _RepeatedKey as err:
        raise DataError(f"{path} gives the key {err.args[0]!r} twice in one object; each key "
                        "may appear once (JSON readers keep only the last)") from None
    except (RecursionError, ValueError) as err:  # deep nesting; an integer of > 4300 digits
        what = "is nested too deeply" if isinstance(err, RecursionError) else \
            "holds an integer with too many digits"
        raise DataError(f"{path} is not a LEAF file: its JSON {what}") from None
    if not isinstance(document, dict):
        raise DataError(f"{path} must hold a JSON object with keys {', '.join(_KEYS)}")
    for key in _KEYS:
        if key not in document:
            raise DataError(f"{path} has no key {key!r} (expected keys: {', '.join(_KEYS)})")
    return document, booleans


def _listed_users(document: dict, path: Path) -> list[tuple[str, int]]:
    """(user, num_samples) pairs of a file, each user checked to have an entry in user_data."""
    users, counts, data = document["users"], document["num_samples"], document["user_data"]
    if not isinstance(users, list) or not isinstance(counts, list) or not isinstance(data, dict):
        kinds = ", ".join(type(v).__name__.replace("dict", "object").replace("NoneType", "null")
                          for v in (users, counts, data))
        raise DataError(f"in {path}, 'users' and 'num_samples' must be lists, 'user_data' an "
                        f"object; got {kinds}")
    if len(counts) != len(users):
        raise DataError(f"{path} lists {len(users)} users but {len(counts)} num_samples")
    for user, count in zip(users, counts):
        # (a JSON escape such as "\ud800" makes a string no file or table can hold)
        if not isinstance(user, str) or not user or any("\ud800" <= c <= "\udfff" for c in user):
            raise DataError(f"user names in {path} must be non-empty strings of text, got "
                            f"{_shown(user)}")
        if user not in data:
            raise DataError(f"user {user!r} listed in {path} has no entry in 'user_data'")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise DataError(f"num_samples of user {user!r} in {path} must be a count (an integer "
                            f">= 0), got {_shown(count)}")
    if len(set(users)) != len(users):
        twice = next(user for i, user in enumerate(users) if user in users[:i])
        raise DataError(f"user {twice!r} is listed twice in {path}")
    listed = set(users)
    unlisted = [user for user in data if user not in listed]
    if unlisted:  # rows that would be silently dropped
        raise DataError(f"'user_data' in {path} holds user(s) not listed in 'users': "
                        f"{', '.join(map(repr, unlisted[:3]))}; list every user once")
    return list(zip(users, counts))


def _is_label(value: Any) -> bool:
    """An integer from 0 to `_MAX_LABEL`, or an integral float (LEAF's CelebA writes 1.0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return 0 <= value <= _MAX_LABEL and (isinstance(value, int) or value.is_integer())


def _labels(values: list, where: str) -> np.ndarray:
    """Integer labels (class indices): a boolean, a string, null, 1.5 or -1 is named."""
    bad = next((i for i, v in enumerate(values) if not _is_label(v)), None)
    if bad is not None:
        value = values[bad]
        hint = "; a boolean: write the class as 0 or 1" if isinstance(value, bool) else ""
        raise DataError(f"labels of {where} must be integers from 0 to {_MAX_LABEL} (class "
                        f"indices), got {_shown(value)} (label {bad}{hint})")
    return np.asarray(values, np.int64)


def _non_number(rows: list) -> Optional[tuple[int, Any]]:
    """(row, value) of the first item of `rows` not a number (string, null, boolean, list)."""
    for i, row in enumerate(rows):
        for value in row:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return i, value
    return None


def _features(rows: list, where: str, booleans: bool = True) -> np.ndarray:
    """Rows of numbers as float32 [N, D]; `booleans`: whether a row may hold a JSON boolean
    (which numpy would read as 0 / 1 beside numbers)."""
    odd = next((i for i, row in enumerate(rows) if not isinstance(row, list)), None)
    if odd is not None:
        raise DataError(f"x of {where} must be a list of rows, each a list of numbers; row "
                        f"{odd} is {_shown(rows[odd])}")
    try:
        x = np.asarray(rows)  # (its dtype tells strings, null and lists from numbers)
    except ValueError:  # rows of different lengths or depths
        x = None
    suspect = x is None or x.dtype.kind not in "iuf" or x.ndim != 2
    found = _non_number(rows) if suspect or booleans else None  # (true beside 2.5 is 1.0)
    if found is not None:
        raise DataError(f"x of {where} must hold numbers only, but row {found[0]} holds "
                        f"{_shown(found[1])}")
    lengths = sorted({len(r) for r in rows})
    if len(lengths) > 1:
        raise DataError(f"x rows of {where} have different lengths ({lengths[0]} to "
                        f"{lengths[-1]})")
    if lengths == [0]:
        raise DataError(f"x rows of {where} are empty; every row needs at least one feature")
    try:
        x = x.astype(np.float64, copy=False)  # (object: integers beyond int64)
        finite = np.isfinite(x)
        big = finite & (np.abs(x) > np.finfo(np.float32).max)  # (infinite as float32)
    except OverflowError:  # an integer beyond any float
        x, finite, big = np.full(x.shape, 1e309), np.ones(x.shape, bool), np.ones(x.shape, bool)
    if not finite.all() or big.any():
        row, col = (int(i[0]) for i in np.nonzero(~finite | big))
        what = "a number beyond float32's range" if big[row, col] else "NaN or infinity"
        raise DataError(f"x of {where} holds {what} (row {row}: {x[row, col]:g}); features "
                        "must be finite numbers of magnitude below 3.4e38")
    return x.astype(np.float32)


def _check_every_client_trains(owner_train: np.ndarray, users: list[str], folder: Path) -> None:
    counts = np.bincount(owner_train, minlength=len(users))
    empty = [users[i] for i in np.flatnonzero(counts == 0)[:5]]
    if empty:
        raise DataError(f"user(s) {', '.join(map(repr, empty))} in {folder} have no training "
                        "rows (num_samples 0); every client needs at least one")

