"""Draw what each of the four distribution shifts (`mcfl.data.shifts`) does to Fashion-MNIST:
one panel per shift, a row per planted group, a column per class (the first image of that class
held by a client of the group; blank where the group holds none).

    .venv/bin/python experiments/shift_pictures.py --out docs/images/shifts.png

Needs Fashion-MNIST (`sudo apt-get install dataset-fashion-mnist`); `--dataset digits` draws
scikit-learn's digits instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcfl.data import parse_partition, partition_arrays  # noqa: E402
from mcfl.data.loaders import load_arrays  # noqa: E402
from mcfl.files.figures import save_figure  # noqa: E402

SHIFTS = (("shift_x:4@1", "P(X): every class turned by the group's angle"),
          ("shift_y:4@0.75", "P(Y): each group its own 4 classes"),
          ("shift_y_given_x:4@0.5", "P(Y|X): a pool of 5 labels permuted per group"),
          ("shift_x_given_y:4@0.3", "P(X|Y): 3 classes turned per group"))


def panel(ax_row, arrays, spec: str, title: str, clients: int, seed: int) -> None:
    data = partition_arrays(arrays, parse_partition(spec), clients, 0.2, "none", seed)
    x = np.asarray(data.arrays.x_train)
    y = np.asarray(data.arrays.y_train)
    group = data.true_cluster[np.asarray(data.arrays.train_owner)]
    for g, ax_line in enumerate(ax_row):
        for k, ax in enumerate(ax_line):
            ax.set_xticks([]), ax.set_yticks([])
            rows = np.flatnonzero((group == g) & (y == k))
            if rows.size:
                image = x[rows[0]]
                ax.imshow(image.reshape(image.shape[0], -1), cmap="gray_r")
            if k == 0:
                ax.set_ylabel(f"group {g}", fontsize=7)
            if g == 0:
                ax.set_title(f"label {k}", fontsize=7)
    ax_row[0][0].annotate(f"{spec}: {title}", (0, 1.6), xycoords="axes fraction",
                          fontsize=9, ha="left")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--out", type=Path, default=Path("docs/images/shifts.png"))
    parser.add_argument("--clients", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arrays = load_arrays(args.dataset, None, False)
    classes = arrays.num_classes
    fig = plt.figure(figsize=(classes * 0.8, len(SHIFTS) * 4 * 0.95))
    grid = fig.add_gridspec(len(SHIFTS), 1, hspace=0.35)
    for i, (spec, title) in enumerate(SHIFTS):
        inner = grid[i].subgridspec(4, classes, wspace=0.05, hspace=0.05)
        axes = [[fig.add_subplot(inner[g, k]) for k in range(classes)] for g in range(4)]
        panel(axes, arrays, spec, title, args.clients, args.seed)
    save_figure(fig, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
