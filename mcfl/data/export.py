"""Write a federated dataset exactly as mcfl trains on it, for other code to read: LEAF JSON
(the format of LEAF, Caldas et al. 2018, and of the FedProx and FlexCFL authors' code) or one
.npz of flat arrays.

Either holds every client's training and test rows (after partitioning, planting and mcfl's
per-client train / test split, in the order mcfl stores them), the client ids and, where the
dataset has them, the planted clusters. Layout of ``--out DIR``:

* ``leaf``: ``train/data.json`` and ``test/data.json``, each ``{"users": [...], "num_samples":
  [...], "user_data": {user: {"x": [[...], ...], "y": [...]}}}`` with feature rows flattened
  (LEAF's own FEMNIST rows are flat too); a client without test rows is left out of the test
  file, as LEAF does. ``true_cluster.json``: ``{"users": [...], "true_cluster": [...]}`` where
  known (mcfl's LEAF loader reads it back; LEAF tools ignore it). Floats are written with the
  shortest decimal that reads back to the same float32, so nothing is rounded.
* ``npz``: ``data.npz`` with ``x_train`` [N, *feature_shape] float32, ``y_train`` [N] int64,
  ``train_owner`` [N] (each row's client index), the same three for test, ``client_ids``,
  ``num_classes`` and, where known, ``true_cluster`` [C]; no pickled objects.
* both: ``mcfl_export.json``, what was written (name, format, clients, rows, classes, feature
  shape) and the settings that built it.

The folder is written beside itself under a temporary name and renamed into place once whole,
so a stop leaves either the finished export or none (an existing folder is replaced only with
``overwrite``). A distribution shift (`mcfl.algorithms.wrappers.shift`) moves rows between clients
during a run; the export is the dataset before any round.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import IO, Any, Optional

import numpy as np

from mcfl.data.federated import FederatedDataset, from_splits
from mcfl.errors import DataError
from mcfl.files import atomic, kinds

FORMATS = ("leaf", "npz")
MANIFEST = "mcfl_export.json"
TRUE_CLUSTER = "true_cluster.json"


def row_indices_of_clients(dataset: FederatedDataset, split: str) -> list[np.ndarray]:
    """Each client's row indices of `split` ("train" or "test"), in mcfl's stored order."""
    a = dataset.arrays
    order = np.asarray(getattr(a, f"{split}_order"))
    offsets = np.asarray(getattr(a, f"{split}_offsets"))
    counts = np.asarray(getattr(a, f"{split}_counts"))
    return [order[o:o + c] for o, c in zip(offsets, counts)]


def export_dataset(dataset: FederatedDataset, out: str | Path, fmt: str,
                   settings: Optional[dict[str, Any]] = None, overwrite: bool = False) -> Path:
    """Write `dataset` to the folder `out` in format `fmt` (FORMATS); returns `out`."""
    if fmt not in FORMATS:
        raise DataError(f"unknown export format {fmt!r}; allowed: {', '.join(FORMATS)}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file; name a folder for the export")
    kinds.check_kind(out, "export")  # --overwrite replaces an export, nothing else
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise DataError(f"--out {out} already holds files; pass --overwrite to replace them")
    if out.is_dir() and any(out.iterdir()) and kinds.folder_kind(out) is None:
        raise DataError(f"--out {out} holds files that are not an mcfl export (no {MANIFEST}); "
                        "--overwrite replaces only an export: choose another --out")
    staging = out.with_name(f".{out.name}.exporting")
    shutil.rmtree(staging, ignore_errors=True)  # what a killed export left
    try:
        staging.mkdir(parents=True)
        (_write_leaf if fmt == "leaf" else _write_npz)(dataset, staging)
        atomic.write_json(staging / MANIFEST, _manifest(dataset, fmt, settings))
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
        atomic.sync_folder(out.parent)
    except (OSError, atomic.WriteError) as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, atomic.WriteError):
            raise
        raise atomic.WriteError(out, error) from error
    return out


def _manifest(dataset: FederatedDataset, fmt: str, settings) -> dict[str, Any]:
    return {"name": dataset.name, "format": fmt, "clients": dataset.num_clients,
            "train_rows": int(dataset.train_counts().sum()),
            "test_rows": int(dataset.test_counts().sum()),
            "num_classes": dataset.num_classes, "feature_shape": list(dataset.feature_shape),
            "true_cluster": dataset.true_cluster is not None, "settings": settings or {}}


def _write_leaf(dataset: FederatedDataset, folder: Path) -> None:
    ids = list(dataset.client_ids)
    a = dataset.arrays
    for split in ("train", "test"):
        x, y = np.asarray(getattr(a, f"x_{split}")), np.asarray(getattr(a, f"y_{split}"))
        rows = row_indices_of_clients(dataset, split)
        (folder / split).mkdir()
        atomic.replace_file(folder / split / "data.json",
                            lambda f, x=x, y=y, rows=rows: _leaf_json(f, ids, x, y, rows))
    if dataset.true_cluster is not None:
        atomic.write_json(folder / TRUE_CLUSTER, {
            "users": ids, "true_cluster": [int(c) for c in dataset.true_cluster]})


def _leaf_json(f: IO[bytes], ids: list[str], x: np.ndarray, y: np.ndarray,
               rows: list[np.ndarray]) -> None:
    """One LEAF document, written a user at a time (never the whole JSON in memory)."""
    kept = [(uid, r) for uid, r in zip(ids, rows) if len(r)]
    f.write(b'{"users": ' + json.dumps([uid for uid, _ in kept]).encode())
    f.write(b', "num_samples": ' + json.dumps([len(r) for _, r in kept]).encode())
    f.write(b', "user_data": {')
    for i, (uid, r) in enumerate(kept):
        # float32 -> Python float is exact, and json writes the shortest repr that reads back
        # to that float: the export holds the float32 values themselves.
        entry = {"x": x[r].reshape(len(r), -1).tolist(), "y": y[r].tolist()}
        f.write((", " if i else "").encode() + json.dumps(uid).encode() + b": "
                + json.dumps(entry).encode())
    f.write(b"}}\n")


def _write_npz(dataset: FederatedDataset, folder: Path) -> None:
    a = dataset.arrays
    arrays: dict[str, np.ndarray] = {}
    for split in ("train", "test"):
        rows = row_indices_of_clients(dataset, split)
        index = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        arrays[f"x_{split}"] = np.asarray(getattr(a, f"x_{split}"))[index]
        arrays[f"y_{split}"] = np.asarray(getattr(a, f"y_{split}"))[index].astype(np.int64)
        arrays[f"{split}_owner"] = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
    arrays["client_ids"] = np.asarray(dataset.client_ids, dtype=str)
    arrays["num_classes"] = np.asarray(dataset.num_classes)
    if dataset.true_cluster is not None:
        arrays["true_cluster"] = np.asarray(dataset.true_cluster, np.int64)
    atomic.write_npz(folder / "data.npz", **arrays)


def read_npz(path: str | Path) -> FederatedDataset:
    """The dataset in an npz export (``DIR/data.npz`` or ``DIR``)."""
    path = Path(path)
    path = path / "data.npz" if path.is_dir() else path
    try:
        with np.load(path, allow_pickle=False) as z:
            a = {key: z[key] for key in z.files}
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: not an mcfl npz export ({error})") from error
    missing = {"x_train", "y_train", "train_owner", "x_test", "y_test", "test_owner",
               "client_ids", "num_classes"} - set(a)
    if missing:
        raise DataError(f"{path}: not an mcfl npz export (missing {', '.join(sorted(missing))})")
    ids = [str(c) for c in a["client_ids"]]
    return from_splits(path.parent.name, (a["x_train"], a["y_train"], a["train_owner"]),
                       (a["x_test"], a["y_test"], a["test_owner"]), len(ids),
                       int(a["num_classes"]), client_ids=ids, true_cluster=a.get("true_cluster"))


def read_true_cluster(folder: str | Path, client_ids: tuple[str, ...]) -> Optional[np.ndarray]:
    """The planted clusters a LEAF export wrote beside its data (None where there is no such
    file), in the order of `client_ids`; every client must be listed, with an integer >= 0."""
    path = Path(folder) / TRUE_CLUSTER
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        users, clusters = document["users"], document["true_cluster"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DataError(f"{path}: expected {{\"users\": [...], \"true_cluster\": [...]}} "
                        f"({error})") from error
    if not isinstance(users, list) or not isinstance(clusters, list) or len(users) != len(
            clusters):
        raise DataError(f"{path}: users and true_cluster must be lists of one length")
    bad = [c for c in clusters if not isinstance(c, int) or isinstance(c, bool) or c < 0]
    if bad:
        raise DataError(f"{path}: true_cluster values must be integers >= 0, got {bad[0]!r}")
    of = dict(zip(map(str, users), clusters))
    absent = [c for c in client_ids if c not in of]
    if absent:
        raise DataError(f"{path}: no true cluster for user {absent[0]!r} "
                        f"({len(absent)} of {len(client_ids)} users missing)")
    return np.asarray([of[c] for c in client_ids], np.int64)
