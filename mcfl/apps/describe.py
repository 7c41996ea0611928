"""`mcfl data describe` / `mcfl data plot`: a dataset's statistics as text, its labels as a
heat map."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mcfl.data.describe import label_counts
from mcfl.data.federated import FederatedDataset
from mcfl.files.figures import save_figure


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
    return save_figure(fig, path)
