"""Statistics of a federated dataset: samples and classes per client (`mcfl data describe`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mcfl.data.federated import FederatedDataset, client_label_counts


def label_counts(ds: FederatedDataset, split: str = "train") -> np.ndarray:
    """[C, num_classes] label counts of every client's `split` rows."""
    a = ds.arrays
    owner, y = (a.train_owner, a.y_train) if split == "train" else (a.test_owner, a.y_test)
    return np.asarray(client_label_counts(owner, y, ds.num_clients, ds.num_classes))


def _spread(values: np.ndarray) -> dict[str, float]:
    return {"min": int(values.min()), "median": float(np.median(values)),
            "max": int(values.max()), "mean": float(values.mean())}


def describe(ds: FederatedDataset) -> dict[str, Any]:
    """Clients, samples per client, classes per client and true-cluster sizes."""
    train, test = ds.train_counts(), ds.test_counts()
    classes = (label_counts(ds) > 0).sum(axis=1)
    out: dict[str, Any] = {
        "name": ds.name,
        "clients": ds.num_clients,
        "num_classes": ds.num_classes,
        "feature_shape": list(ds.feature_shape),
        "train_samples": int(train.sum()),
        "test_samples": int(test.sum()),
        "train_per_client": _spread(train),
        "test_per_client": _spread(test),
        "classes_per_client": _spread(classes),
        "true_cluster_sizes": None,
    }
    if ds.true_cluster is not None:
        out["true_cluster_sizes"] = np.bincount(ds.true_cluster).tolist()
    return out
