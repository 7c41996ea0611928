"""Synthetic(alpha, beta): the FedProx generator (Li et al., 2020, Sec. 5.1; after Shamir et al.).

Per client i: a size ``floor(lognormal(4, 2)) + 50``; ``u_i ~ N(0, alpha)`` and ``B_i ~ N(0, beta)``
(scales are standard deviations, as in the FedProx code); a local model ``W_i ~ N(u_i, 1)``
(60 x 10), ``b_i ~ N(u_i, 1)``; inputs ``x ~ N(v_i, Sigma)`` with ``v_i ~ N(B_i, 1)`` and
``Sigma = diag(j^-1.2)``; labels ``y = argmax(x W_i + b_i)``. alpha controls how much the local
models differ, beta how much the local inputs differ. 90/10 train/test split per client.
"""

from __future__ import annotations

import numpy as np

from mcfl.data.federated import FederatedDataset, from_owner
from mcfl.errors import DataError

DIMENSION = 60
NUM_CLASSES = 10
_CHUNK = 8192  # rows per chunk when applying per-client models (bounds host memory)


def generate_synthetic(
    num_clients: int,
    alpha: float,
    beta: float,
    seed: int,
    test_fraction: float = 0.1,
) -> FederatedDataset:
    """Generate Synthetic(alpha, beta) for `num_clients` clients, reproducibly from `seed`."""
    if num_clients < 1:
        raise DataError(f"synthetic data needs at least 1 client, got {num_clients}")
    if alpha < 0 or beta < 0:
        raise DataError(f"synthetic alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4.0, 2.0, num_clients).astype(np.int64) + 50
    model_mean = rng.normal(0.0, alpha, num_clients)
    input_shift = rng.normal(0.0, beta, num_clients)
    input_mean = rng.normal(input_shift[:, None], 1.0, (num_clients, DIMENSION))
    weights = rng.normal(model_mean[:, None, None], 1.0, (num_clients, DIMENSION, NUM_CLASSES))
    biases = rng.normal(model_mean[:, None], 1.0, (num_clients, NUM_CLASSES))
    std = np.arange(1, DIMENSION + 1, dtype=np.float64) ** -0.6  # sqrt of j^-1.2

    owner = np.repeat(np.arange(num_clients), sizes)
    x = np.empty((owner.size, DIMENSION), np.float32)
    y = np.empty(owner.size, np.int32)
    for start in range(0, owner.size, _CHUNK):
        who = owner[start : start + _CHUNK]
        xc = input_mean[who] + rng.standard_normal((who.size, DIMENSION)) * std
        logits = np.einsum("nd,ndk->nk", xc, weights[who]) + biases[who]
        x[start : start + _CHUNK] = xc
        y[start : start + _CHUNK] = logits.argmax(axis=1)
    return from_owner(
        f"synthetic({alpha:g},{beta:g})",
        x,
        y,
        owner,
        num_clients,
        NUM_CLASSES,
        test_fraction,
        rng,
    )
