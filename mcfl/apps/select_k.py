"""`mcfl select-k`'s files: select_k.csv (one row per candidate K), select_k.json (the rows,
the recommendation, the sampled clients and the settings) and select_k.png."""

from __future__ import annotations

from pathlib import Path

from mcfl.files.atomic import write_csv, write_json
from mcfl.files.figures import save_figure
from mcfl.files.run_folder import json_safe


def write_select_k(out: Path, found: dict, config) -> None:
    write_csv(out / "select_k.csv", found["rows"])
    document = {**found, "config": config.to_dict()}
    write_json(out / "select_k.json", json_safe(document))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [r["k"] for r in found["rows"]]
    fig, (ax_acc, ax_dist) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_acc.plot(ks, [r["accuracy_micro"] for r in found["rows"]], "o-", label="micro")
    ax_acc.plot(ks, [r["accuracy_macro"] for r in found["rows"]], "s--", label="macro")
    ax_acc.axvline(found["recommended"], color="grey", linestyle=":", label="by accuracy")
    ax_acc.set(xlabel="K", ylabel="test accuracy",
               title=f"{config.algorithm}: {found['sample']} clients, {found['rounds']} rounds")
    ax_acc.legend(fontsize=8)
    distances = [r["intra_cluster_distance"] for r in found["rows"]]
    if all(d is not None for d in distances):
        ax_dist.plot(ks, distances, "o-")
    if found["elbow"] is not None:
        ax_dist.axvline(found["elbow"], color="grey", linestyle=":", label="elbow")
        ax_dist.legend(fontsize=8)
    ax_dist.set(xlabel="K", ylabel="intra-cluster distance", title="intra-cluster distance")
    for ax in (ax_acc, ax_dist):
        ax.grid(alpha=0.3)
        ax.set_xticks(ks)
    save_figure(fig, out / "select_k.png")
