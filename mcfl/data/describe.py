"""Statistics and a label-distribution heat map of a federated dataset (`mcfl data ...`)."""

from __future__ import annotations

from pathlib import Path
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


def format_description(d: dict[str, Any]) -> str:
    def row(label, s):
        return (f"  {label:<26} min {s['min']:>7,}   median {s['median']:>9,.1f}   "
                f"max {s['max']:>7,}")

    lines = [
        f"{d['name']}: {d['clients']:,} clients, {d['num_classes']} classes, "
        f"features {tuple(d['feature_shape'])}",
        f"  samples                    train {d['train_samples']:,}   test {d['test_samples']:,}",
        row("train samples per client", d["train_per_client"]),
        row("test samples per client", d["test_per_client"]),
        row("classes per client (train)", d["classes_per_client"]),
    ]
    sizes = d["true_cluster_sizes"]
    lines.append(f"  true clusters              {sizes if sizes else 'none'}")
    return "\n".join(lines)


def plot_label_distribution(ds: FederatedDataset, path: Path, max_clients: int = 500) -> Path:
    """A heat map of each client's training label proportions (clients as rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = label_counts(ds)[:max_clients].astype(np.float64)
    props = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    fig, ax = plt.subplots(figsize=(6, 7))
    image = ax.imshow(props, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set(xlabel="class", ylabel="client", title=f"{ds.name}: label share per client")
    if len(counts) < ds.num_clients:
        ax.set_ylabel(f"client (first {len(counts)} of {ds.num_clients})")
    fig.colorbar(image, ax=ax, label="share of the client's training samples")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
