"""Synthetic(alpha, beta): the FedProx generator (Li et al., 2020, Sec. 5.1; after Shamir et al.).

Per client i: a size ``floor(lognormal(4, 2)) + 50``; ``u_i ~ N(0, alpha)`` and ``B_i ~ N(0, beta)``
(scales are standard deviations, as in the FedProx code); a local model ``W_i ~ N(u_i, 1)``
(60 x 10), ``b_i ~ N(u_i, 1)``; inputs ``x ~ N(v_i, Sigma)`` with ``v_i ~ N(B_i, 1)`` and
``Sigma = diag(j^-1.2)``; labels ``y = argmax(x W_i + b_i)``. alpha controls how much the local
models differ, beta how much the local inputs differ. 90/10 train/test split per client.
"""

from __future__ import annotations

import numpy as np

from mcfl.data.federated import DeviceRows, FederatedDataset, from_splits
from mcfl.errors import DataError

DIMENSION = 60
NUM_CLASSES = 10
_CHUNK = 65536  # rows generated at a time (bounds the float64 temporaries)


def generate_synthetic(
    num_clients: int,
    alpha: float,
    beta: float,
    seed: int,
    test_fraction: float = 0.1,
) -> FederatedDataset:
    """Generate Synthetic(alpha, beta) for `num_clients` clients, reproducibly from `seed`.

    Rows are generated in chunks and written straight into float32 train and test arrays on
    the device (`DeviceRows`), so the build holds the rows once, plus a chunk. A client's
    first ``floor((1 - test_fraction) m)`` rows (at least one, and at
    least one left for testing when m >= 2) are its training rows: its rows are i.i.d., so
    this is a random split.
    """
    if num_clients < 1:
        raise DataError(f"synthetic data needs at least 1 client, got {num_clients}")
    if alpha < 0 or beta < 0:
        raise DataError(f"synthetic alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4.0, 2.0, num_clients).astype(np.int64) + 50
    model_mean = rng.normal(0.0, alpha, num_clients)
    input_shift = rng.normal(0.0, beta, num_clients)
    input_mean = rng.normal(input_shift[:, None], 1.0, (num_clients, DIMENSION))
    weights = rng.normal(model_mean[:, None, None], 1.0, (num_clients, DIMENSION, NUM_CLASSES))
    biases = rng.normal(model_mean[:, None], 1.0, (num_clients, NUM_CLASSES))
    std = (np.arange(1, DIMENSION + 1, dtype=np.float64) ** -0.6).astype(np.float32)  # sqrt j^-1.2
    input_mean = input_mean.astype(np.float32)

    n_train = np.floor((1.0 - test_fraction) * sizes + 1e-9).astype(np.int64)
    n_train = np.clip(n_train, 1, np.maximum(sizes - 1, 1))
    first_row = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    total = int(sizes.sum())
    num_train = int(n_train.sum())
    x_train, x_test = DeviceRows((num_train, DIMENSION)), DeviceRows((total - num_train, DIMENSION))
    y_train, y_test = np.empty(num_train, np.int32), np.empty(total - num_train, np.int32)
    filled = [0, 0]  # rows written so far to train, test
    for start in range(0, total, _CHUNK):
        rows = np.arange(start, min(start + _CHUNK, total))
        who = np.searchsorted(first_row, rows, side="right") - 1
        xc = rng.standard_normal((who.size, DIMENSION), dtype=np.float32)
        xc *= std
        xc += input_mean[who]
        # Labels client by client (a chunk's clients are contiguous): gathering a 60 x 10
        # model per row would move 4.8 KB per row.
        yc = np.empty(who.size, np.int64)
        clients, first = np.unique(who, return_index=True)
        for c, lo, hi in zip(clients, first, np.append(first[1:], who.size)):
            yc[lo:hi] = (xc[lo:hi] @ weights[c] + biases[c]).argmax(axis=1)
        is_train = rows - first_row[who] < n_train[who]
        for part, (x_out, y_out) in enumerate(((x_train, y_train), (x_test, y_test))):
            mask = is_train if part == 0 else ~is_train
            k = int(mask.sum())
            x_out.write(filled[part], xc[mask])
            y_out[filled[part]:filled[part] + k] = yc[mask]
            filled[part] += k
    clients = np.arange(num_clients)
    return from_splits(
        f"synthetic({alpha:g},{beta:g})",
        (x_train.array, y_train, np.repeat(clients, n_train)),
        (x_test.array, y_test, np.repeat(clients, sizes - n_train)),
        num_clients,
        NUM_CLASSES,
    )
