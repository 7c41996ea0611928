"""The data of `mcfl bench`: a generated Gaussian mixture in which every client holds exactly
the same number of rows, so the work per client is constant and round time should grow
linearly with the clients (`mcfl.apps.bench_point` measures it). Built vectorised, in blocks,
and written straight to the device.
"""

from __future__ import annotations

import numpy as np

from mcfl.data.federated import DeviceRows, from_splits

NUM_CLASSES = 10
CHUNK_ELEMENTS = 1 << 22  # rows are generated in blocks of about this many floats
NOISE_BANK = 4096  # distinct noise vectors of the generated rows ...
NOISE_BANK_ELEMENTS = 1 << 24  # ... and at most this many floats of them (64 MB)


def mixture_blocks(rng: np.random.Generator, n: int, centers: np.ndarray,
                   component: np.ndarray, scale: float = 1.0):
    """Rows ``centers[component[j]] + scale * noise_j`` of an [n, d] float32 array, generated
    in blocks: yields (first row, block) with one block buffer reused (copy it to keep it).

    The noise of a row is one of a bank of (at most NOISE_BANK) Gaussian N(0, I) vectors, picked
    at random: drawing n x d fresh normals would take most of the time at 100,000 clients, and
    the work a round does does not depend on the values.
    """
    d = centers.shape[1]
    rows = max(1, min(n, NOISE_BANK, NOISE_BANK_ELEMENTS // max(1, d)))
    bank = rng.standard_normal((rows, d), dtype=np.float32)
    bank *= np.float32(scale)
    step = max(1, CHUNK_ELEMENTS // max(1, d))
    block = np.empty((min(n, step), d), np.float32)
    noise = np.empty_like(block)
    for start in range(0, n, step):
        size = min(step, n - start)
        np.take(centers, component[start:start + size], axis=0, out=block[:size], mode="clip")
        np.take(bank, rng.integers(0, len(bank), size), axis=0, out=noise[:size], mode="clip")
        block[:size] += noise[:size]
        yield start, block[:size]


def fill_mixture(rng: np.random.Generator, out, centers: np.ndarray, component: np.ndarray,
                 scale: float = 1.0):
    """Fill `out` [n, d] (a float32 NumPy array, or a `DeviceRows` buffer) block by block with
    `mixture_blocks`, so no second n x d array is made."""
    n = out.shape[0] if isinstance(out, np.ndarray) else out.array.shape[0]
    for start, block in mixture_blocks(rng, n, centers, component, scale):
        if isinstance(out, np.ndarray):
            out[start:start + len(block)] = block
        else:
            out.write(start, block)
    return out


def _mixture_rows(rng: np.random.Generator, means: np.ndarray, group: np.ndarray, rows: int):
    """`rows` labelled rows per client: client i's rows come from the class means of its
    group ``group[i]``, written straight to the device. Returns (x, y, owner), sorted by
    client."""
    num_groups, num_classes, num_features = means.shape
    owner = np.repeat(np.arange(group.size), rows)
    y = rng.integers(0, num_classes, owner.size)
    x = DeviceRows((owner.size, num_features))
    fill_mixture(rng, x, means.reshape(-1, num_features), group[owner] * num_classes + y)
    return x.array, y, owner


def benchmark_dataset(
    num_clients: int,
    num_features: int,
    rows_per_client: int = 50,
    test_rows_per_client: int = 10,
    num_classes: int = NUM_CLASSES,
    num_groups: int = 4,
    seed: int = 0,
):
    """A federated dataset in which every client holds exactly `rows_per_client` training rows
    and `test_rows_per_client` test rows, for constant work per client at any scale.

    Client i belongs to planted group ``i % num_groups`` (its `true_cluster`); each group has its
    own 10 class means drawn from N(0, I), and a row is its class mean plus N(0, I) noise. Built
    vectorised (100,000 clients x 50 rows x 60 features in seconds) and deterministic per seed.
    """
    means_rng, train_rng, test_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)
    )
    means = means_rng.standard_normal((num_groups, num_classes, num_features), dtype=np.float32)
    group = np.arange(num_clients) % num_groups
    train = _mixture_rows(train_rng, means, group, rows_per_client)
    test = _mixture_rows(test_rng, means, group, test_rows_per_client)
    return from_splits("bench", train, test, num_clients, num_classes, true_cluster=group)


