"""Federated datasets: every client's samples held once, in one flat array per split.

Client ``i`` owns the rows ``offsets[i] : offsets[i] + counts[i]`` of ``x_train`` / ``y_train``
(and likewise for the test split). Nothing is padded to the largest client: ragged sizes are
handled by the engine with masks, so the shapes below are fixed for a whole run.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from mcfl.errors import DataError

# The most classes a dataset may have (labels 0 .. MAX_CLASSES - 1): a label of 2^31 would size
# the [clients, classes] label counts at 2^31. Every loader checks its labels against it.
MAX_CLASSES = 65_536


class FederatedData(flax.struct.PyTreeNode):
    """The device-side arrays of a federated dataset (a pytree, passed to jitted rounds).

    Shapes: ``x_*`` [N, *feature_shape]; ``y_*`` [N] int32; ``*_owner`` [N] int32 (the client
    of each row; ``C`` for a row no client holds now); ``*_offsets`` and ``*_counts`` [C] int32;
    ``*_order`` [N] int32: the rows sorted by owner, so client i's rows are
    ``order[offsets[i] : offsets[i] + counts[i]]``; ``train_label_counts`` [C, num_classes]
    int32 counts each client's training labels. As built, rows are stored sorted by client and
    the order is the identity; a distribution shift (`mcfl.algorithms.wrappers.shift`) moves rows
    between clients by changing owners, offsets, counts, order and label counts, never the row
    arrays, and sets ``owners_changed`` (a bool scalar) in the round it does.
    """

    x_train: jax.Array
    y_train: jax.Array
    train_owner: jax.Array
    train_offsets: jax.Array
    train_counts: jax.Array
    x_test: jax.Array
    y_test: jax.Array
    test_owner: jax.Array
    test_offsets: jax.Array
    test_counts: jax.Array
    train_order: jax.Array
    test_order: jax.Array
    train_label_counts: jax.Array
    owners_changed: jax.Array
    num_classes: int = flax.struct.field(pytree_node=False)
    min_train_count: int = flax.struct.field(pytree_node=False)
    # An upper bound on any client's training rows (static: it sizes the low-rank buffers).
    max_train_count: int = flax.struct.field(pytree_node=False)

    @property
    def num_clients(self) -> int:
        return self.train_counts.shape[0]


class DeviceRows:
    """A [n, ...] array on the device, written chunk by chunk.

    Generators fill it as they go, so building N rows holds them once (on the device) plus a
    chunk on the host, instead of a host copy and a device copy. Each write updates the buffer
    in place (it is donated to a jitted `dynamic_update_slice`).
    """

    def __init__(self, shape: tuple[int, ...], dtype=jnp.float32):
        self.array = jnp.zeros(shape, dtype)

    def write(self, start: int, rows: np.ndarray) -> None:
        if len(rows):
            self.array = _write_rows(self.array, jnp.asarray(rows, self.array.dtype),
                                     jnp.int32(start))


@functools.partial(jax.jit, donate_argnums=0)
def _write_rows(buffer, rows, start):
    return jax.lax.dynamic_update_slice_in_dim(buffer, rows, start, axis=0)


def client_label_counts(owner: jax.Array, labels: jax.Array, num_clients: int,
                        num_classes: int) -> jax.Array:
    """[C, num_classes] label counts of each client's rows (owner C, a row nobody holds, is
    left out)."""
    counts = jnp.zeros((num_clients + 1, num_classes), jnp.int32)
    return counts.at[owner, labels].add(1)[:num_clients]


@dataclasses.dataclass(frozen=True)
class FederatedDataset:
    """A federated dataset: device arrays plus host-side metadata (ids, ground truth)."""

    name: str
    arrays: FederatedData
    client_ids: tuple[str, ...]
    feature_shape: tuple[int, ...]
    true_cluster: Optional[np.ndarray] = None  # [C] planted cluster id, where known
    # clients held out of training, scored at evaluation (`mcfl.data.unseen`)
    unseen: Optional[FederatedDataset] = None

    @property
    def num_clients(self) -> int:
        return len(self.client_ids)

    @property
    def num_classes(self) -> int:
        return self.arrays.num_classes

    def train_counts(self) -> np.ndarray:
        return np.asarray(self.arrays.train_counts)

    def test_counts(self) -> np.ndarray:
        return np.asarray(self.arrays.test_counts)


def split_train_test(
    owner: np.ndarray,
    num_clients: int,
    test_fraction: float,
    rng: np.random.Generator,
    labels: Optional[np.ndarray] = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-client train/test split of the rows in `owner` (vectorised, no loop over clients).

    Rows are split in groups, after a shuffle. Without `labels` a group is a client's rows and
    keeps ``floor((1 - test_fraction) * m)`` of its m rows for training (the FedProx generators'
    90/10 rule), at least one, and at least one for testing when m >= 2. With `labels` a group is
    a (client, label) pair (stratified): it keeps ``round((1 - test_fraction) * m)`` rows, at
    least one, so every class a client holds is in its training split and the test share stays
    near `test_fraction` even for tiny clients. Either way, a client left without a test row
    gives one training row to testing if it has two or more.

    Returns the indices of the training rows and of the test rows.
    """
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test fraction (--test-fraction) must be a number in (0, 1), got "
                        f"{test_fraction}")
    rows = np.flatnonzero(owner >= 0)
    rows = rows[rng.permutation(rows.size)]
    group = owner[rows] if labels is None else owner[rows] * (labels.max() + 1) + labels[rows]
    order = np.argsort(group, kind="stable")
    rows, group = rows[order], group[order]
    _, starts, sizes = np.unique(group, return_index=True, return_counts=True)
    group_index = np.repeat(np.arange(sizes.size), sizes)
    rank = np.arange(rows.size) - starts[group_index]  # position of each row in its group
    if labels is None:
        n_train = np.floor((1.0 - test_fraction) * sizes + 1e-9).astype(np.int64)
        n_train = np.clip(n_train, 1, np.maximum(sizes - 1, 1))
    else:
        n_train = np.clip(np.floor((1.0 - test_fraction) * sizes + 0.5), 1, sizes).astype(np.int64)
    is_train = rank < n_train[group_index]
    # A client whose groups are all single rows has no test row yet: move its first one.
    client = owner[rows]
    has_test = np.bincount(client[~is_train], minlength=num_clients) > 0
    total = np.bincount(client, minlength=num_clients)
    lacking = ~has_test[client] & (total[client] >= 2)
    _, first = np.unique(client[lacking], return_index=True)
    is_train[np.flatnonzero(lacking)[first]] = False
    return rows[is_train], rows[~is_train]


def from_owner(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    owner: np.ndarray,
    num_clients: int,
    num_classes: int,
    test_fraction: float,
    rng: np.random.Generator,
    client_ids: Optional[Sequence[str]] = None,
    true_cluster: Optional[np.ndarray] = None,
    stratify: bool = False,
) -> FederatedDataset:
    """Build a federated dataset from one labelled array and the client of each row.

    ``owner[j]`` is the client of row ``j`` (or -1 to leave the row out). Every client must end
    up with at least one training row; a client with none is an error naming it. `stratify`
    splits each client's rows per label (see `split_train_test`).
    """
    owner = np.asarray(owner, dtype=np.int64)
    if owner.shape != (len(x),) or len(y) != len(x):
        raise DataError(f"{name}: x, y and owner must have the same length, got {len(x)}, "
                        f"{len(y)}, {owner.shape}")
    if owner.size and owner.max() >= num_clients:
        raise DataError(f"{name}: owner ids must be < {num_clients} clients, got {owner.max()}")
    counts = np.bincount(owner[owner >= 0], minlength=num_clients)
    empty = np.flatnonzero(counts == 0)
    if empty.size:
        raise DataError(
            f"{name}: {empty.size} client(s) have no data (first: {empty[:5].tolist()}); "
            f"every client needs at least one sample: give fewer --clients (it has "
            f"{int(counts.sum())} rows for {num_clients}) or another --partition"
        )
    train_rows, test_rows = split_train_test(
        owner, num_clients, test_fraction, rng, labels=np.asarray(y) if stratify else None
    )
    return from_splits(
        name,
        (x[train_rows], y[train_rows], owner[train_rows]),
        (x[test_rows], y[test_rows], owner[test_rows]),
        num_clients,
        num_classes,
        client_ids,
        true_cluster,
    )


def _on_device(x):
    """Rows as a device array: one copy of host rows (`jax.device_put`: ``jnp.asarray`` holds
    two at peak); rows already on the device are used as they are."""
    return x if isinstance(x, jax.Array) else jax.device_put(x)


def from_splits(
    name: str,
    train: tuple[np.ndarray, np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray, np.ndarray],
    num_clients: int,
    num_classes: int,
    client_ids: Optional[Sequence[str]] = None,
    true_cluster: Optional[np.ndarray] = None,
) -> FederatedDataset:
    """Build a federated dataset from (x, y, owner) triples already split into train and test.

    Rows already sorted by owner are used as they are (no copy on the host); each array is then
    copied to the device once (`jax.device_put`; ``jnp.asarray`` would hold two copies at
    peak), so a caller that builds sorted float32 rows holds them at most twice.
    """
    parts = []
    for split, (x, y, owner) in (("train", train), ("test", test)):
        owner = np.asarray(owner, dtype=np.int64)
        y = np.asarray(y)
        if y.size and (y.min() < 0 or y.max() >= num_classes):
            raise DataError(
                f"{name}: {split} labels must lie in [0, {num_classes}) (this dataset has "
                f"{num_classes} classes), got [{y.min()}, {y.max()}]"
            )
        x = x if isinstance(x, jax.Array) else np.asarray(x)  # device rows stay where they are
        if isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating) and x.size:
            finite = np.isfinite(x.reshape(len(x), -1)).all(axis=1)
            if not finite.all():
                row = int(np.flatnonzero(~finite)[0])
                raise DataError(f"{name}: {split} row {row} (client {int(owner[row])}) holds "
                                "NaN or infinity; features must be finite numbers")
        counts = np.bincount(owner, minlength=num_clients).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        if owner.size and not np.all(owner[1:] >= owner[:-1]):
            order = np.argsort(owner, kind="stable")
            x, y, owner = x[order], y[order], owner[order]
        parts.append((x, y, owner, offsets, counts))
    (xtr, ytr, otr, offtr, ctr), (xte, yte, ote, offte, cte) = parts
    no_train = np.flatnonzero(ctr == 0)
    if no_train.size:
        first = [client_ids[i] if client_ids is not None and len(client_ids) == num_clients
                 else int(i) for i in no_train[:5]]
        raise DataError(
            f"{name}: {no_train.size} of its {num_clients} client(s) have no training rows "
            f"(first: {first}); every client needs at least one: give fewer --clients, a "
            "smaller --test-fraction or a larger --samples-per-client"
        )
    if client_ids is None:
        client_ids = tuple(str(i) for i in range(num_clients))
    if len(client_ids) != num_clients:
        raise DataError(f"{name}: got {len(client_ids)} client ids for {num_clients} clients")
    arrays = FederatedData(
        x_train=_on_device(xtr),
        y_train=jnp.asarray(ytr, jnp.int32),
        train_owner=jnp.asarray(otr, jnp.int32),
        train_offsets=jnp.asarray(offtr, jnp.int32),
        train_counts=jnp.asarray(ctr, jnp.int32),
        x_test=_on_device(xte),
        y_test=jnp.asarray(yte, jnp.int32),
        test_owner=jnp.asarray(ote, jnp.int32),
        test_offsets=jnp.asarray(offte, jnp.int32),
        test_counts=jnp.asarray(cte, jnp.int32),
        train_order=jnp.arange(len(ytr), dtype=jnp.int32),
        test_order=jnp.arange(len(yte), dtype=jnp.int32),
        train_label_counts=jnp.asarray(np.bincount(
            otr * num_classes + np.asarray(ytr, np.int64), minlength=num_clients * num_classes
        ).reshape(num_clients, num_classes), jnp.int32),
        owners_changed=jnp.zeros((), bool),
        num_classes=int(num_classes),
        min_train_count=int(ctr.min()),
        max_train_count=int(ctr.max()),
    )
    return FederatedDataset(
        name=name,
        arrays=arrays,
        client_ids=tuple(str(c) for c in client_ids),
        feature_shape=tuple(xtr.shape[1:]),
        true_cluster=None if true_cluster is None else np.asarray(true_cluster, np.int64),
    )


def subset_clients(dataset: FederatedDataset, clients) -> FederatedDataset:
    """A dataset of only `clients` (ascending ids) with their rows, renumbered 0..n-1 (their
    client ids and planted clusters kept). Rows are gathered on the device."""
    clients = np.asarray(clients, np.int64)
    a = dataset.arrays
    parts = []
    for x, y, offsets, counts in ((a.x_train, a.y_train, a.train_offsets, a.train_counts),
                                  (a.x_test, a.y_test, a.test_offsets, a.test_counts)):
        start, count = np.asarray(offsets)[clients], np.asarray(counts)[clients]
        rows = np.concatenate([np.arange(s, s + c) for s, c in zip(start, count)]
                              ) if len(clients) else np.zeros(0, np.int64)
        owner = np.repeat(np.arange(len(clients)), count)
        parts.append((x[jnp.asarray(rows)], np.asarray(y)[rows], owner))
    ids = [dataset.client_ids[i] for i in clients]
    true = None if dataset.true_cluster is None else dataset.true_cluster[clients]
    return from_splits(dataset.name, parts[0], parts[1], len(clients), dataset.num_classes, ids,
                       true)
