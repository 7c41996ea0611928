"""`mcfl plot clusters RUN_DIR`: the clients' local models in two dimensions, coloured by the
cluster the run assigned them to and marked by their planted cluster where the data has one
(FeSEM's Fig. 3). Reads the run folder's clients_pca.npz (`mcfl.runs.embedding`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mcfl.errors import DataError
from mcfl.files.figures import save_figure

MARKERS = "o^sDvP*Xh<>p"


def plot_clusters(run_dir: Path, out: Path) -> Path:
    path = Path(run_dir) / "clients_pca.npz"
    if not path.is_file():
        raise DataError(f"{run_dir} has no clients_pca.npz: runs of clustered algorithms write "
                        "it (with embed_clients > 0)")
    try:
        with np.load(path, allow_pickle=False) as f:
            found = {k: f[k] for k in f.files}
    except (OSError, ValueError) as e:
        raise DataError(f"{path} cannot be read: {e}") from None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    coords, cluster = found["coords"], found["cluster"]
    true = found.get("true_cluster")
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    colours = plt.get_cmap("tab10")
    for k in np.unique(cluster):
        for t in (np.unique(true) if true is not None else [None]):
            pick = (cluster == k) & ((true == t) if t is not None else True)
            if not pick.any():
                continue
            label = f"cluster {k}" if t is None else f"cluster {k}, true {t}"
            ax.scatter(coords[pick, 0], coords[pick, 1], s=22, alpha=0.8, label=label,
                       color=colours(int(k) % 10) if k >= 0 else "grey",
                       marker=MARKERS[int(t) % len(MARKERS)] if t is not None else "o")
    explained = found["explained"]
    ax.set(xlabel=f"PC 1 ({explained[0]:.0%} of the variance)",
           ylabel=f"PC 2 ({explained[1]:.0%})",
           title=f"{found['algorithm']}: {len(coords)} clients' local models")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, Path(out))
