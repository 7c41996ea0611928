"""A labelled dataset held as arrays, before it is partitioned over clients."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class LabelledArrays:
    """All samples of a dataset, pooled (official train and test splits concatenated, train
    first; mcfl re-splits per client).

    ``x`` [N, *feature_shape]: raw pixels as uint8 for image datasets ([N, H, W] or
    [N, H, W, C]), float32 otherwise. ``y`` [N] int64 in ``[0, num_classes)``.
    ``official_train`` [N] bool marks the rows of the official train split (recipes such as
    Ditto's draw their per-client test rows from the official test split).
    """

    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    official_train: np.ndarray

    @property
    def is_image(self) -> bool:
        return self.x.ndim >= 3

    def __len__(self) -> int:
        return int(self.y.shape[0])


def pooled(name: str, train: tuple, test: tuple, num_classes: int) -> LabelledArrays:
    """Concatenate official (x, y) train and test splits into one LabelledArrays."""
    (xtr, ytr), (xte, yte) = train, test
    x = np.concatenate([xtr, xte])
    y = np.concatenate([ytr, yte]).astype(np.int64)
    official = np.concatenate([np.ones(len(ytr), bool), np.zeros(len(yte), bool)])
    return LabelledArrays(name, x, y, int(num_classes), official)
