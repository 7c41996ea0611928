"""A picture of each partition recipe, drawn from the recipe itself on scikit-learn's digits.

Each picture is one `mcfl.load_dataset` of the recipe (40 clients of the 1,797 digits, seed 0): a
heat map of every client's label shares, with a strip beside it of the client's planted group
where the recipe plants groups, and for recipes that change the images (rotations) the same
digit as each group sees it. The docs site draws them when it is built, so a changed recipe
changes its picture.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, NamedTuple, Union

import numpy as np

from mcfl.config import RunConfig
from mcfl.data.describe import label_counts
from mcfl.data.partition import rotate_images
from mcfl.runs.runner import load_dataset


class Recipe(NamedTuple):
    partition: str
    caption: str


RECIPES = (
    Recipe("iid", "shuffled, near-equal parts: every client holds every class"),
    Recipe("dirichlet:0.3", "label shares per client from Dir(0.3)"),
    Recipe("shards:2", "exactly 2 classes a client"),
    Recipe("fedprox-mnist", "FedProx's MNIST recipe: classes u % 10 and (u + 1) % 10"),
    Recipe("ditto-fmnist", "Ditto's recipe: 5 consecutive classes in lognormal proportions"),
    Recipe("rotated:4", "4 planted groups; group k's images turned by k x 90 degrees"),
    Recipe("permuted:4", "4 planted groups, each relabelling by its own permutation"),
    Recipe("label_swap:4", "4 planted groups; groups 1-3 swap their own label pairs"),
    Recipe("shift_x:4@1", "P(X) shift: group r's images turned by 360 r / 4 degrees"),
    Recipe("shift_y:4@1", "P(Y) shift: each group holds its own subset of the classes"),
    Recipe("shift_y_given_x:4@0.5", "P(Y|X) shift: groups permute one shared pool of labels"),
    Recipe("shift_x_given_y:4@0.5", "P(X|Y) shift: groups turn one shared pool of classes"),
)

NUM_CLIENTS = 40


def file_name(partition: str) -> str:
    """The picture's file name for `partition` ("shift_x:4@1" -> "shift_x-4-1.png")."""
    return partition.replace(":", "-").replace("@", "-").replace(".", "_") + ".png"


def draw(recipe: Recipe, out: Union[Path, BinaryIO]) -> None:
    """Draw `recipe`'s picture as a PNG to `out`, a path or a binary file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dataset = load_dataset(RunConfig(dataset="digits", partition=recipe.partition,
                                     clients=NUM_CLIENTS, seed=0))
    counts = label_counts(dataset).astype(np.float64)
    shares = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    groups = dataset.true_cluster
    if groups is not None:  # clients ordered by group, so each group's block shows
        order = np.argsort(np.asarray(groups), kind="stable")
        shares, groups = shares[order], np.asarray(groups)[order]
    rotates = recipe.partition.startswith(("rotated", "shift_x"))
    columns = [1, 12] if groups is not None else [12]
    fig = plt.figure(figsize=(5.2, 4.6 if rotates else 3.8))
    grid = fig.add_gridspec(2 if rotates else 1, len(columns), width_ratios=columns,
                            height_ratios=[4, 1] if rotates else [1], wspace=0.05,
                            hspace=0.35)
    heat = fig.add_subplot(grid[0, -1])
    heat.imshow(shares, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0)
    heat.set(xlabel="class", title=f"--partition {recipe.partition}", yticks=[])
    heat.set_xticks(range(dataset.num_classes))
    if groups is not None:
        strip = fig.add_subplot(grid[0, 0])
        strip.imshow(np.asarray(groups)[:, None], aspect="auto", interpolation="nearest",
                     cmap="tab10", vmin=0, vmax=9)
        strip.set(xticks=[], yticks=[],
                  ylabel=f"client (of {dataset.num_clients}, by planted group)")
    else:
        heat.set_ylabel(f"client (of {dataset.num_clients})")
    if rotates:
        _one_digit_per_group(fig, grid[1, :], dataset, len(np.unique(groups)))
    fig.savefig(out, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)


def _one_digit_per_group(fig, cell, dataset, num_groups: int) -> None:
    """The first training image, turned as each of the `num_groups` groups sees it (k x 360 /
    R degrees, `mcfl.data.partition.rotate_images`)."""
    image = np.asarray(dataset.arrays.x_train)[0].reshape(8, 8)
    # (every row is turned back to group 0's view first: the row may belong to any group)
    first_group = int(np.asarray(dataset.true_cluster)[int(dataset.arrays.train_owner[0])])
    upright = rotate_images(image[None], np.array([(num_groups - first_group) % num_groups]),
                            num_groups)[0]
    turned = rotate_images(np.repeat(upright[None], num_groups, axis=0),
                           np.arange(num_groups), num_groups)
    sub = cell.subgridspec(1, num_groups, wspace=0.1)
    for group in range(num_groups):
        ax = fig.add_subplot(sub[0, group])
        ax.imshow(turned[group], cmap="gray_r")
        ax.set(xticks=[], yticks=[], xlabel=f"group {group}")


def partitions_page(image_folder: str) -> str:
    """The gallery page: one picture a recipe, `image_folder` relative to the page."""
    lines = ["# Partition recipes, drawn", "",
             f"Each picture is the recipe applied to scikit-learn's digits ({NUM_CLIENTS} "
             "clients, seed 0), drawn when this site was built: each row a client, its label "
             "shares as colours; beside it, the planted group of each client where the recipe "
             "plants groups; for recipes that turn images, one digit as each group sees it.",
             ""]
    for recipe in RECIPES:
        lines += [f"**`{recipe.partition}`**: {recipe.caption}.", "",
                  f"![{recipe.partition}]({image_folder}/{file_name(recipe.partition)})", ""]
    return "\n".join(lines)
