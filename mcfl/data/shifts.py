"""The four kinds of distribution shift between planted groups of clients (FLUX's benchmark,
Fenoglio et al., NeurIPS 2025), each with a number of groups R and a strength s in (0, 1].

Group 0 is the reference; groups 1..R-1 are shifted. With x the features and y the label:

- ``shift_x`` (feature shift, P(X) changes, P(Y|X) kept in the transformed space): group r's
  images, of every class, are turned by ``s * 360 * r / R`` degrees (at s = 1 this is
  ``rotated:R``). FLUX also tints colour channels, which turns one-channel images into three;
  mcfl keeps the input shape so that every model runs on every shift, and scales the angle by
  the strength instead of FLUX's table of (rotations, colours) per level.
- ``shift_y`` (label shift, P(Y) changes, P(X|Y) kept): group r holds only the classes of its
  own subset of ``K - round(s (K - 2))`` classes (K at s -> 0, 2 at s = 1; FLUX: 11 - level
  of 10), drawn at random and distinct between groups where there are enough subsets. Each
  class's rows are dealt equally among the groups that hold it; a class no group holds is
  left out. Within a group, the run's label partition (iid, ``dirichlet:ALPHA``, ``shards:C``)
  deals the group's rows to its clients, so P(Y) skew between groups composes with
  Dirichlet skew between clients. FLUX instead up-samples a client's kept classes with
  replacement back to its original size; mcfl never duplicates a row.
- ``shift_y_given_x`` (concept shift, same features, different labels; P(X) kept, P(Y) kept
  when classes are balanced): a pool of ``max(2, round(s K))`` labels is drawn once; group r
  relabels the pool's labels by its own permutation of the pool (group 0: the identity; the
  R - 1 others distinct and not the identity, as FLUX's clients each shuffle one shared pool).
- ``shift_x_given_y`` (concept shift, same labels, different features; P(Y) kept): a pool of
  ``max(1, round(s K))`` classes is drawn once; group r turns the images of each pool class
  by its own angle from {0, 90, 180, 270} degrees (group 0: none; the others distinct and not
  all zero), as FLUX's class-conditional rotations; other classes are left as they are.

Groups are balanced (or sized by proportions) and dealt to clients at random
(`partition.planted_cluster_ids`), where FLUX's clients each draw a pattern uniformly (so a
pattern may be drawn by no client). Feature transforms see the original labels (P(X|Y) is
conditioned on the true class); label maps come last.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Optional

import numpy as np

from mcfl.errors import DataError

SHIFT_KINDS = ("shift_x", "shift_y", "shift_y_given_x", "shift_x_given_y")
DEFAULT_STRENGTH = 0.5
RIGHT_ANGLES = (0, 90, 180, 270)


def classes_per_group(strength: float, num_classes: int) -> int:
    """How many classes a ``shift_y`` group holds: K - round(s (K - 2)), at least 1."""
    return max(1, num_classes - int(round(strength * max(num_classes - 2, 0))))


def label_pool_size(strength: float, num_classes: int) -> int:
    """How many labels ``shift_y_given_x`` permutes: max(2, round(s K)), at most K."""
    return min(num_classes, max(2, int(round(strength * num_classes))))


def rotated_pool_size(strength: float, num_classes: int) -> int:
    """How many classes ``shift_x_given_y`` turns: max(1, round(s K)), at most K."""
    return min(num_classes, max(1, int(round(strength * num_classes))))


def _distinct(draw: Callable[[], np.ndarray], first: np.ndarray, count: int,
              available: int, what: str) -> np.ndarray:
    """[count, ...]: `first`, then rows from `draw` until `count` distinct ones (redraws only on a
    repeat). `available` is how many distinct rows there are, checked first."""
    if count > available:
        raise DataError(what)
    rows, seen = [first], {first.tobytes()}
    while len(rows) < count:
        row = draw()
        if row.tobytes() not in seen:
            seen.add(row.tobytes())
            rows.append(row)
    return np.stack(rows)


def group_class_subsets(num_groups: int, num_classes: int, strength: float,
                        rng: np.random.Generator) -> np.ndarray:
    """[R, K] bool: the classes each ``shift_y`` group holds (see the module docstring)."""
    m = classes_per_group(strength, num_classes)

    def draw():
        held = np.zeros(num_classes, bool)
        held[rng.choice(num_classes, m, replace=False)] = True
        return held

    available = math.comb(num_classes, m)
    return _distinct(draw, draw(), num_groups, available,
                     f"shift_y:{num_groups}@{strength:g} gives each group {m} of {num_classes} "
                     f"classes, which make only {available} distinct subsets for {num_groups} "
                     "groups: give fewer groups or another strength")


def group_rows(labels: np.ndarray, holds: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[N] the ``shift_y`` group of every row (-1: no group holds its class): each class's rows,
    shuffled, dealt in near-equal parts to the groups whose subset holds it."""
    group = np.full(labels.size, -1, np.int64)
    for cls in range(holds.shape[1]):  # a loop over the K classes, on the host
        holders = np.flatnonzero(holds[:, cls])
        rows = np.flatnonzero(labels == cls)
        if holders.size == 0 or rows.size == 0:
            continue
        rows = rows[rng.permutation(rows.size)]
        group[rows] = holders[np.arange(rows.size) * holders.size // rows.size]
    return group


def label_pool_maps(num_groups: int, num_classes: int, strength: float,
                    rng: np.random.Generator) -> np.ndarray:
    """[R, K] label maps of ``shift_y_given_x``: row 0 the identity, each other row a distinct
    non-identity permutation of one shared pool of labels, the identity elsewhere."""
    m = label_pool_size(strength, num_classes)
    pool = np.sort(rng.choice(num_classes, m, replace=False))

    def draw():
        out = np.arange(num_classes)
        out[pool] = pool[rng.permutation(m)]
        return out

    available = math.factorial(min(m, 12))
    return _distinct(draw, np.arange(num_classes), num_groups, available,
                     f"shift_y_given_x:{num_groups}@{strength:g} permutes a pool of {m} of "
                     f"{num_classes} labels, which has {available - 1} permutations besides the "
                     f"identity for the {num_groups - 1} shifted groups: give fewer groups or "
                     "a larger strength")


def class_angles(num_groups: int, num_classes: int, strength: float,
                 rng: np.random.Generator) -> np.ndarray:
    """[R, K] angles in degrees of ``shift_x_given_y``: row 0 all zero, each other row a
    distinct choice from {0, 90, 180, 270} for each class of one shared pool (not all zero),
    zero for the other classes."""
    m = rotated_pool_size(strength, num_classes)
    pool = np.sort(rng.choice(num_classes, m, replace=False))

    def draw():
        out = np.zeros(num_classes, np.int64)
        out[pool] = rng.choice(RIGHT_ANGLES, m)
        return out

    available = 4 ** min(m, 15)
    return _distinct(draw, np.zeros(num_classes, np.int64), num_groups, available,
                     f"shift_x_given_y:{num_groups}@{strength:g} turns a pool of {m} of "
                     f"{num_classes} classes, which has {available - 1} choices of angles "
                     f"besides none for the {num_groups - 1} shifted groups: give fewer groups "
                     "or a larger strength")


def rotate_rows(images: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Each image [H, W(, C)] turned counter-clockwise by its angle in degrees: exact for right
    angles (`np.rot90`), bilinear otherwise (`scipy.ndimage.rotate`, same canvas, zero fill)."""
    if images.ndim < 3 or images.shape[1] != images.shape[2]:
        raise DataError(f"a rotation needs square images ([N, H, H] or [N, H, H, C]), got rows "
                        f"of shape {images.shape[1:]}")
    out = images.copy()
    for angle in np.unique(angles):  # a loop over the few distinct angles
        angle = float(angle) % 360
        if angle == 0:
            continue
        rows = angles % 360 == angle
        if angle % 90 == 0:
            out[rows] = np.rot90(images[rows], k=int(angle // 90), axes=(1, 2))
        else:
            from scipy.ndimage import rotate

            out[rows] = rotate(images[rows], angle, axes=(2, 1), reshape=False, order=1)
    return out


def shift_rows(shifts: tuple, x: np.ndarray, y: np.ndarray, row_group: np.ndarray,
               num_groups: int, num_classes: int, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) with the feature and label shifts of `shifts` ((kind, strength) pairs; the
    ownership shift ``shift_y`` is `group_rows`' job) applied to each row by its group
    `row_group`: feature transforms first, on the original labels, then label maps."""
    by_kind = dict(shifts)
    angles: Optional[np.ndarray] = None
    if "shift_x" in by_kind:
        angles = by_kind["shift_x"] * 360.0 * row_group / num_groups
    if "shift_x_given_y" in by_kind:
        table = class_angles(num_groups, num_classes, by_kind["shift_x_given_y"], rng)
        turned = table[row_group, y]
        angles = turned if angles is None else angles + turned
    if angles is not None:
        x = rotate_rows(x, np.asarray(angles, np.float64))
    if "shift_y_given_x" in by_kind:
        maps = label_pool_maps(num_groups, num_classes, by_kind["shift_y_given_x"], rng)
        y = maps[row_group, y]
    return x, y
