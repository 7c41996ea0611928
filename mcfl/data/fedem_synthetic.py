"""FedEM's synthetic mixture dataset (Marfoq et al., "Federated Multi-Task Learning under a
Mixture of Distributions", NeurIPS 2021; the generator of their repository omarfoq/FedEM,
``data/synthetic/generate_data.py``).

Every client's data is a mixture of ``M`` shared binary classification tasks. The procedure
(defaults as the authors' generator and the paper's Table 2 command have them):

- ``M = 3`` components, each a direction ``theta_m`` with coordinates uniform on [-1, 1] in
  ``d = 150`` dimensions; 2 classes.
- Client ``i`` (300 clients in the paper) holds ``min(floor(lognormal(4, 2)) + 50, 1000)``
  training rows and draws its mixture weights ``pi_i ~ Dirichlet(0.4, ..., 0.4)``.
- Each split (train, then test) of a client draws how many of its rows each component owns,
  ``multinomial(n, pi_i)``; every row's inputs are uniform on [-1, 1]^d (the same marginal for
  all clients); a row of component ``m`` is labelled ``1`` when ``x . theta_m + eps > 0``,
  ``eps ~ N(0, 0.1^2)`` (their ``round(sigmoid(.))``), else ``0``.
- The test split is drawn the same way, separately: 5,000 rows per client (so the test
  accuracy pooled over clients is the plain mean over clients, as the paper reports it).

The released generator labels rows with one quirk (its loop over components never advances
the row index): it writes each component's labels from the first row of the split onwards
instead of into the component's own block, so the rows ``[0, count_m)`` get the labels of the
*last* component (in order ``0..M-1``) whose count exceeds the row's position, and the rows
past the largest count keep the label 0 whatever their inputs (about 29% of rows). mcfl
generates the process as the paper and the README describe it (``labels="described"``: each
row labelled by its own component); ``labels="released"`` reproduces the released generator,
whose data are the likelier source of the published numbers (Python API:
``generate_fedem_synthetic(..., labels="released")``). Either way a client's rows are then
shuffled.

Ground truth: the clients have no hard clusters. ``true_cluster`` is each client's dominant
component: the argmax of the shares of its rows that each component labels in expectation,
which are its mixture weights ``pi_i`` for ``labels="described"`` and, for the released rule,
``pi_im - max_{k > m} pi_ik`` (at least 0; the last component keeps ``pi_i,M-1``).

Deviations: mcfl draws with its own seeded ``numpy.random.Generator`` (the authors seed the
legacy global generator with 12345), so the rows are the same distribution, not the same rows;
`test_fraction`, when given, replaces the 5,000 test rows by ``round(n f / (1 - f))`` (at least
one), so that the test rows are a share ``f`` of the client's rows; the training rows keep the
authors' sizes either way. Their options for unseen clients (``train_tasks_frac``) and
non-uniform marginals (never implemented there) are left out.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from mcfl.data.federated import DeviceRows, FederatedDataset, from_splits
from mcfl.errors import DataError

NAME = "fedem-synthetic"
NUM_CLIENTS = 300  # the paper's Table 2 (the generator has no default: --n_tasks is required)
NUM_COMPONENTS = 3
DIMENSION = 150
NUM_CLASSES = 2  # the authors' generator supports binary labels only
NOISE_LEVEL = 0.1  # standard deviation of the logit noise
ALPHA = 0.4  # Dirichlet concentration of the mixture weights (smaller: more dissimilar)
TEST_ROWS = 5000  # test rows per client
MIN_ROWS, MAX_ROWS = 50, 1000  # training rows per client: floor(lognormal(4, 2)) + 50, capped
LABEL_RULES = ("described", "released")
_CHUNK = 65536  # rows generated at a time (bounds the temporaries)


def train_sizes(rng: np.random.Generator, num_clients: int) -> np.ndarray:
    """The clients' training rows, drawn first from the generator's RNG."""
    sizes = rng.lognormal(4.0, 2.0, num_clients).astype(np.int64) + MIN_ROWS
    return np.minimum(sizes, MAX_ROWS)


def test_sizes(sizes: np.ndarray, test_fraction: Optional[float]) -> np.ndarray:
    """Test rows per client: the authors' 5,000, or a share `test_fraction` of its rows."""
    if test_fraction is None:
        return np.full_like(sizes, TEST_ROWS)
    extra = np.rint(sizes * (test_fraction / (1.0 - test_fraction))).astype(np.int64)
    return np.maximum(extra, 1)


def row_count(num_clients: int, seed: int, test_fraction: Optional[float] = None) -> int:
    """Rows (train + test) the generator makes for `num_clients` from `seed` (its sizes drawn
    as it draws them), for the memory check."""
    sizes = train_sizes(np.random.default_rng(seed), num_clients)
    return int(sizes.sum() + test_sizes(sizes, test_fraction).sum())


def label_shares(weights: np.ndarray, labels: str = "described") -> np.ndarray:
    """[C, M] the expected share of each client's rows that each component labels (the rest,
    under the released rule, keep the label 0)."""
    weights = np.asarray(weights, np.float64)
    if labels == "described":
        return weights
    later_max = np.zeros(weights.shape[:-1])  # max over the components after m
    shares = np.empty_like(weights)
    for m in range(weights.shape[-1] - 1, -1, -1):
        shares[..., m] = np.maximum(weights[..., m] - later_max, 0.0)
        later_max = np.maximum(later_max, weights[..., m])
    return shares


def row_components(counts: np.ndarray, labels: str = "described") -> np.ndarray:
    """The component labelling each row of one client's split, in the order the rows are
    generated (before the shuffle), from ``counts[m]``, the rows component m owns; -1 for a
    row that keeps the label 0 (released rule only)."""
    counts = np.asarray(counts, np.int64)
    rank = np.arange(int(counts.sum()))
    return _components(rank, counts[None, :], np.zeros(rank.size, np.int64), labels)


def _components(rank: np.ndarray, counts: np.ndarray, who: np.ndarray, labels: str) -> np.ndarray:
    """Vectorised `row_components` over many clients: row j is row ``rank[j]`` of client
    ``who[j]``, whose components own ``counts[who[j]]`` rows."""
    component = np.full(rank.size, -1, np.int64)
    if labels == "released":  # component m overwrites the rows [0, counts[m])
        for m in range(counts.shape[1]):
            component[counts[who, m] > rank] = m
    else:  # component m owns the rows [counts[:m].sum(), counts[:m + 1].sum())
        ends = np.cumsum(counts, axis=1)
        component = (rank[:, None] >= ends[who, :-1]).sum(axis=1)
    return component


def generate_fedem_synthetic(
    num_clients: int = NUM_CLIENTS,
    seed: int = 0,
    test_fraction: Optional[float] = None,
    *,
    num_components: int = NUM_COMPONENTS,
    dimension: int = DIMENSION,
    alpha: float = ALPHA,
    noise_level: float = NOISE_LEVEL,
    labels: str = "described",
) -> FederatedDataset:
    """Generate FedEM's synthetic mixture dataset for `num_clients` clients, reproducibly
    from `seed` (the procedure, its defaults and its deviations: the module's docstring).

    Draws, in order: the training sizes, the mixture weights, the components; then per split
    (train, test) the rows each component owns, the rows' order within each client, the rows'
    label noise, and their inputs, chunk by chunk, written straight into float32 arrays on the
    device (the rows do not depend on the chunk size).
    """
    if num_clients < 1:
        raise DataError(f"{NAME} needs at least 1 client, got {num_clients}")
    if num_components < 1 or dimension < 1:
        raise DataError(f"{NAME} needs at least 1 component and 1 dimension, got "
                        f"{num_components} and {dimension}")
    if not alpha > 0 or not noise_level >= 0:
        raise DataError(f"{NAME}: alpha must be > 0 and noise_level >= 0, got alpha={alpha}, "
                        f"noise_level={noise_level}")
    if test_fraction is not None and not 0.0 < test_fraction < 1.0:
        raise DataError(f"test fraction (--test-fraction) must be a number in (0, 1), got "
                        f"{test_fraction}")
    if labels not in LABEL_RULES:
        raise DataError(f"{NAME}: labels must be one of {', '.join(LABEL_RULES)}, got "
                        f"{labels!r}")
    rng = np.random.default_rng(seed)
    n_train = train_sizes(rng, num_clients)
    weights = rng.dirichlet(np.full(num_components, alpha), num_clients)
    theta = rng.uniform(-1.0, 1.0, (num_components, dimension))
    splits = [_split(rng, n, weights, theta, noise_level, labels)
              for n in (n_train, test_sizes(n_train, test_fraction))]
    return from_splits(NAME, splits[0], splits[1], num_clients, NUM_CLASSES,
                       true_cluster=label_shares(weights, labels).argmax(axis=1))


def _split(rng: np.random.Generator, sizes: np.ndarray, weights: np.ndarray, theta: np.ndarray,
           noise_level: float, labels: str) -> tuple:
    """One split's (x on the device, y, owner), rows sorted by client."""
    who = np.repeat(np.arange(sizes.size), sizes)
    first_row = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    counts = rng.multinomial(sizes, weights)
    component = _components(np.arange(who.size) - first_row[who], counts, who, labels)
    component = component[np.lexsort((rng.random(who.size), who))]  # shuffle within clients
    total, dimension = who.size, theta.shape[1]
    theta32 = theta.T.astype(np.float32)
    noise = rng.normal(0.0, noise_level, total) if noise_level > 0 else np.zeros(total)
    x_out, y = DeviceRows((total, dimension)), np.empty(total, np.int32)
    for start in range(0, total, _CHUNK):
        stop = min(start + _CHUNK, total)
        x = rng.random((stop - start, dimension), dtype=np.float32)
        x *= 2.0
        x -= 1.0  # uniform on [-1, 1)
        z = component[start:stop]
        logit = (x @ theta32)[np.arange(stop - start), np.maximum(z, 0)] + noise[start:stop]
        y[start:stop] = (z >= 0) & (logit > 0)
        x_out.write(start, x)
    return x_out.array, y, who
