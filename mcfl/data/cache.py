"""An on-disk cache of prepared federated datasets: one .npz (no pickle) per data config.

The key hashes every setting that shapes the data, a fingerprint (names, sizes, modification
times) of the source files, and the source code of the data package, so editing the data, a
loader or a recipe invalidates the entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np

from mcfl.data.federated import FederatedDataset, from_splits

FORMAT_VERSION = 1  # of the .npz layout
_MAX_FINGERPRINT_FILES = 10_000


def code_fingerprint() -> str:
    """A hash of the data package's source: any change to a loader or recipe changes it."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def default_cache_dir() -> Path:
    return Path(os.environ.get("MCFL_CACHE_DIR", Path.home() / ".cache" / "mcfl"))


def source_fingerprint(data_dir: Optional[str]) -> list:
    """(relative path, size, mtime) of the files under `data_dir`, up to 3 levels deep."""
    if data_dir is None or not Path(data_dir).is_dir():
        return []
    root = Path(data_dir).resolve()
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        if len(Path(dirpath).relative_to(root).parts) >= 3:
            dirnames.clear()
        for name in sorted(filenames):
            stat = (Path(dirpath) / name).stat()
            entries.append([str(Path(dirpath, name).relative_to(root)), stat.st_size,
                            stat.st_mtime_ns])
            if len(entries) >= _MAX_FINGERPRINT_FILES:
                return sorted(entries)
    return sorted(entries)


def cache_key(settings: dict[str, Any]) -> str:
    payload = json.dumps({"version": FORMAT_VERSION, "code": code_fingerprint(), **settings},
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def cache_path(cache_dir: Path, name: str, key: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    return Path(cache_dir) / f"{safe}-{key}.npz"


def save(path: Path, ds: FederatedDataset) -> None:
    """Write atomically (temp file, then rename) so a crash never leaves a half entry; the
    temp file is the process's own, so processes filling one cache (parallel runs, the test
    workers) never write into each other's."""
    a = ds.arrays
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(
        tmp,
        name=np.array(ds.name),
        num_classes=np.array(a.num_classes),
        client_ids=np.array(ds.client_ids),
        true_cluster=np.array([] if ds.true_cluster is None else ds.true_cluster, np.int64),
        x_train=np.asarray(a.x_train), y_train=np.asarray(a.y_train),
        owner_train=np.asarray(a.train_owner),
        x_test=np.asarray(a.x_test), y_test=np.asarray(a.y_test),
        owner_test=np.asarray(a.test_owner),
    )
    os.replace(tmp, path)


def load(path: Path) -> Optional[FederatedDataset]:
    """The cached dataset at `path`, or None if there is none (or it cannot be read)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            true_cluster = f["true_cluster"]
            ids = [str(c) for c in f["client_ids"]]
            return from_splits(
                str(f["name"]),
                (f["x_train"], f["y_train"], f["owner_train"]),
                (f["x_test"], f["y_test"], f["owner_test"]),
                len(ids), int(f["num_classes"]), ids,
                true_cluster if true_cluster.size else None,
            )
    except (OSError, KeyError, ValueError):
        return None  # a damaged entry is rebuilt, not trusted
