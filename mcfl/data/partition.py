"""Label partitions of one labelled array over clients. Each returns ``owner`` [N]: the client of
every row. Vectorised and loop-free over clients, so 10,000 clients cost milliseconds.
"""

from __future__ import annotations

import math

import numpy as np

from mcfl.errors import DataError


def _check_clients(num_rows: int, num_clients: int, min_per_client: int) -> None:
    if num_clients < 1:
        raise DataError(f"number of clients must be >= 1, got {num_clients}")
    if num_rows < num_clients * min_per_client:
        raise DataError(
            f"{num_clients} clients need at least {num_clients * min_per_client} samples "
            f"({min_per_client} each), but the dataset has {num_rows}"
        )


def iid(num_rows: int, num_clients: int, rng: np.random.Generator) -> np.ndarray:
    """Shuffle the rows and deal them into `num_clients` near-equal parts."""
    _check_clients(num_rows, num_clients, 1)
    owner = np.arange(num_rows) * num_clients // num_rows  # sizes differ by at most one
    return owner[rng.permutation(num_rows)]


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_per_client: int = 2,
) -> np.ndarray:
    """Dirichlet(alpha) label skew (Hsu et al., 2019), without resampling loops.

    For every class c, client shares ``p_c ~ Dir(alpha * 1)`` and the class's rows are dealt by
    ``Multinomial(n_c, p_c)``. Small alpha and many clients leave some clients short; instead
    of redrawing until none is (the usual loop, endless for alpha = 0.05 and 10,000 clients),
    rows beyond each client's first `min_per_client` are moved at random to the short clients.
    The default of 2 leaves every client one training and one test sample.
    """
    if not alpha > 0:
        raise DataError(f"dirichlet alpha must be > 0, got {alpha}")
    labels = np.asarray(labels)
    _check_clients(labels.size, num_clients, min_per_client)
    owner = np.empty(labels.size, np.int64)
    for cls in np.unique(labels):  # a loop over classes (at most a few hundred), not clients
        rows = np.flatnonzero(labels == cls)
        rows = rows[rng.permutation(rows.size)]
        shares = rng.dirichlet(np.full(num_clients, alpha))
        counts = rng.multinomial(rows.size, shares)
        owner[rows] = np.repeat(np.arange(num_clients), counts)
    return _top_up(owner, num_clients, min_per_client, rng)


def _top_up(
    owner: np.ndarray, num_clients: int, minimum: int, rng: np.random.Generator
) -> np.ndarray:
    """Give every client at least `minimum` rows by moving spare rows from larger clients."""
    counts = np.bincount(owner, minlength=num_clients)
    deficit = np.maximum(minimum - counts, 0)
    if not deficit.any():
        return owner
    shuffled = rng.permutation(owner.size)
    by_owner = shuffled[np.argsort(owner[shuffled], kind="stable")]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(owner.size, np.int64)
    rank[by_owner] = np.arange(owner.size) - starts[owner[by_owner]]
    spare = np.flatnonzero(rank >= minimum)  # rows whose owner keeps `minimum` without them
    moved = rng.choice(spare, size=int(deficit.sum()), replace=False)
    owner = owner.copy()
    owner[moved] = np.repeat(np.arange(num_clients), deficit)
    return owner


def deal_by_counts(labels: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Hand out rows by per-(client, class) counts [C, K]: the rows of class k, shuffled, go to
    the clients in order of `counts[:, k]`; rows beyond the column's sum stay unused (-1).
    Column sums must not exceed the class sizes (callers cap them)."""
    owner = np.full(labels.size, -1, np.int64)
    num_clients = counts.shape[0]
    for cls in range(counts.shape[1]):  # a loop over classes, not clients
        rows = np.flatnonzero(labels == cls)
        rows = rows[rng.permutation(rows.size)][: counts[:, cls].sum()]
        owner[rows] = np.repeat(np.arange(num_clients), counts[:, cls])
    return owner


def _class_sizes(labels: np.ndarray, num_classes: int) -> np.ndarray:
    return np.bincount(labels, minlength=num_classes)


def _cap_to_class_sizes(demand: np.ndarray, sizes: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """Integer counts from a [C, K] demand; where a class's demand exceeds its size, the demand
    above `floor` (a guaranteed minimum per pair, e.g. one row per held class) is scaled down."""
    above = np.maximum(demand - floor, 0)
    room = np.maximum(sizes - floor.sum(axis=0), 0)
    total = above.sum(axis=0)
    scale = np.where(total > room, room / np.maximum(total, 1), 1.0)
    return (floor + np.floor(above * scale)).astype(np.int64)


def _check_classes_per_client(c: int, num_classes: int, what: str) -> None:
    if not 1 <= c <= num_classes:
        raise DataError(
            f"{what} needs between 1 and {num_classes} classes per client "
            f"(the dataset has {num_classes} classes), got {c}"
        )


def _consecutive_classes(num_clients: int, c: int, num_classes: int) -> np.ndarray:
    """[C, c]: client u holds classes (u + j) % K, as in the FedProx and Ditto generators."""
    return (np.arange(num_clients)[:, None] + np.arange(c)[None, :]) % num_classes


def shards(
    labels: np.ndarray, num_clients: int, classes_per_client: int, num_classes: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Every client holds exactly `classes_per_client` distinct classes (McMahan et al.'s
    pathological non-IID split, made exact): client slots are dealt round-robin over a random
    class order, so each class has about C*c/K holders, and each class's rows are split evenly
    among its holders. Every row is used."""
    _check_classes_per_client(classes_per_client, num_classes, "shards")
    _check_clients(labels.size, num_clients, 2)
    class_order = rng.permutation(num_classes)
    client_order = rng.permutation(num_clients)
    slots = client_order[:, None] * classes_per_client + np.arange(classes_per_client)
    held = class_order[slots % num_classes]  # [C, c], distinct within a row since c <= K
    holders = np.zeros((num_clients, num_classes), np.int64)
    np.put_along_axis(holders, held, 1, axis=1)
    sizes = _class_sizes(labels, num_classes)
    num_holders = holders.sum(0)
    short = np.flatnonzero((num_holders > 0) & (sizes < num_holders))
    if short.size:
        k = short[0]
        raise DataError(
            f"shards:{classes_per_client}: class {k} has {sizes[k]} samples for "
            f"{num_holders[k]} clients; use fewer clients or more classes per client"
        )
    # Split class k evenly: the first (n_k mod h_k) holders get one extra row.
    rank = np.cumsum(holders, axis=0) - 1  # position of each holder among the class's holders
    base = sizes // np.maximum(num_holders, 1)
    extra = (rank < (sizes % np.maximum(num_holders, 1))).astype(np.int64)
    counts = holders * (base + extra)
    return deal_by_counts(labels, counts, rng)


def fedprox_mnist(
    labels: np.ndarray, num_clients: int, num_classes: int, rng: np.random.Generator,
    classes_per_client: int = 2, first: int = 5,
) -> np.ndarray:
    """The FedProx MNIST recipe (Li et al., 2020; their data generator): client u holds classes
    (u + j) % K for j < 2; each (client, class) pair first gets 5 rows, then the class's
    remaining rows are shared among its pairs in proportion to lognormal(0, 2) draws (floored,
    so a few rows stay unused: 69,035 of 70,000 for 1,000 MNIST clients in the paper)."""
    _check_classes_per_client(classes_per_client, num_classes, "fedprox-mnist")
    held = _consecutive_classes(num_clients, classes_per_client, num_classes)
    pairs = np.zeros((num_clients, num_classes), np.int64)
    np.add.at(pairs, (np.repeat(np.arange(num_clients), classes_per_client), held.ravel()), 1)
    sizes = _class_sizes(labels, num_classes)
    reserved = first * pairs.sum(0)
    short = np.flatnonzero(reserved > sizes)
    if short.size:
        k = short[0]
        raise DataError(
            f"fedprox-mnist with {num_clients} clients needs {first} samples for each of the "
            f"{pairs[:, k].sum()} clients holding class {k} ({reserved[k]}), but it has "
            f"{sizes[k]}; use fewer clients"
        )
    weights = rng.lognormal(0.0, 2.0, pairs.shape) * pairs
    shares = weights / np.maximum(weights.sum(0), 1e-300) * (sizes - reserved)
    counts = first * pairs + np.floor(shares).astype(np.int64)
    return deal_by_counts(labels, counts, rng)


def ditto_fmnist(
    labels: np.ndarray, num_clients: int, num_classes: int, rng: np.random.Generator,
    classes_per_client: int = 5,
) -> np.ndarray:
    """The Ditto FashionMNIST recipe (Li et al., 2021; their data generator): client sizes
    lognormal(3, 1) + 10, rescaled so all clients together take the whole dataset; client u
    holds classes (u + j) % K for j < 5 in lognormal(1, 1) proportions, plus one row each.

    Unlike the original, which re-uses rows from the start of a class when it runs out, a class
    in short supply is scaled down, so no row is given twice (a few stay unused). Ditto draws
    test rows from the official test split at 1/6 of the train rows; here the per-client split
    uses test fraction 1/7, the same proportion."""
    _check_classes_per_client(classes_per_client, num_classes, "ditto-fmnist")
    sizes = rng.lognormal(3.0, 1.0, num_clients) + 10
    sizes = sizes / sizes.sum() * labels.size
    props = rng.lognormal(1.0, 1.0, (num_clients, classes_per_client))
    props /= props.sum(1, keepdims=True)
    held = _consecutive_classes(num_clients, classes_per_client, num_classes)
    rows = (np.repeat(np.arange(num_clients), classes_per_client), held.ravel())
    demand = np.zeros((num_clients, num_classes))
    np.add.at(demand, rows, (np.floor(props * sizes[:, None]) + 1).ravel())
    one_each = np.zeros((num_clients, num_classes))
    one_each[rows] = 1
    class_sizes = _class_sizes(labels, num_classes)
    short = np.flatnonzero(one_each.sum(0) > class_sizes)
    if short.size:
        k = short[0]
        raise DataError(
            f"ditto-fmnist with {num_clients} clients needs a sample of class {k} for each of "
            f"its {int(one_each[:, k].sum())} holders, but it has {class_sizes[k]}"
        )
    return deal_by_counts(labels, _cap_to_class_sizes(demand, class_sizes, one_each), rng)


# ----------------------------------------------------------------------------------------------
# Planted clusters (IFCA, Ghosh et al. 2020): each client carries one of R transformations,
# whose index is its true cluster id: rotated images, permuted labels or swapped label pairs.


def cap_rows(owner: np.ndarray, per_client: int, rng: np.random.Generator) -> np.ndarray:
    """`owner` with at most `per_client` rows left to each client, drawn at random; the rest
    become unused (-1). IFCA's protocol gives each client n samples (Ghosh et al., 2020)."""
    order = rng.permutation(owner.size)
    shuffled = owner[order]
    by_client = np.argsort(shuffled, kind="stable")  # rows of client 0, then 1, ...
    sorted_owner = shuffled[by_client]
    first = np.searchsorted(sorted_owner, sorted_owner, side="left")
    rank = np.empty(owner.size, np.int64)
    rank[by_client] = np.arange(owner.size) - first  # the row's place among its client's
    capped = owner.copy()
    capped[order[(rank >= per_client) & (shuffled >= 0)]] = -1
    return capped


def planted_cluster_ids(num_clients: int, num_clusters: int, rng: np.random.Generator,
                        shares: tuple[float, ...] = ()):
    """[C] true cluster ids in random order: balanced (sizes differ by at most one), or with
    cluster k holding ``round(C shares_k / sum(shares))`` clients (the rounding's rest in the
    largest; each at least one)."""
    if not 1 <= num_clusters <= num_clients:
        raise DataError(
            f"planted clusters need 1 <= R <= {num_clients} clients, got R = {num_clusters}"
        )
    if not shares:
        return rng.permutation(np.arange(num_clients) % num_clusters)
    weights = np.asarray(shares, np.float64)
    sizes = np.maximum(1, np.round(num_clients * weights / weights.sum())).astype(int)
    sizes[np.argmax(sizes)] += num_clients - sizes.sum()
    if sizes.min() < 1:
        raise DataError(f"planted proportions {shares} leave a cluster without clients among "
                        f"{num_clients}")
    return rng.permutation(np.repeat(np.arange(num_clusters), sizes))


def rotate_images(x: np.ndarray, row_cluster: np.ndarray, num_clusters: int) -> np.ndarray:
    """Rotate the images of cluster k by k * 360 / R degrees (exact for multiples of 90)."""
    if x.ndim < 3:
        raise DataError(
            f"rotated:{num_clusters} needs image data ([N, H, W]), got features of shape "
            f"{x.shape[1:]}"
        )
    out = x.copy()
    for k in range(1, num_clusters):  # a loop over the R clusters
        rows = row_cluster == k
        angle = 360.0 * k / num_clusters
        if angle % 90 == 0:
            out[rows] = np.rot90(x[rows], k=int(angle // 90), axes=(1, 2))
        else:
            from scipy.ndimage import rotate

            out[rows] = rotate(x[rows], angle, axes=(2, 1), reshape=False, order=1)
    return out


def label_permutations(num_clusters: int, num_classes: int, rng: np.random.Generator):
    """[R, K] distinct label permutations, the first the identity."""
    if num_clusters > math.factorial(min(num_classes, 12)):
        raise DataError(
            f"permuted:{num_clusters} needs {num_clusters} distinct permutations of "
            f"{num_classes} labels; there are only {math.factorial(num_classes)}"
        )
    perms = [np.arange(num_classes)]
    while len(perms) < num_clusters:  # redraws only on a repeat: rare unless K is tiny
        p = rng.permutation(num_classes)
        if not any(np.array_equal(p, q) for q in perms):
            perms.append(p)
    return np.stack(perms)


def label_swaps(num_clusters: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """[R, K] label maps of ``label_swap:R``: label shift by swapping pairs of labels, the
    concept shift of recent clustered-FL benchmarks (FedRC, Guo et al., ICML 2024; CFL-GP, ICML
    2024); the pairing below is mcfl's.

    Cluster 0 keeps every label (row 0 is the identity). Each other cluster r draws an order of
    the K labels, ``p = rng.permutation(K)``, and exchanges the labels of consecutive pairs,
    ``p[0] <-> p[1], p[2] <-> p[3], ...``: floor(K/2) disjoint pairs (with K odd, ``p[K-1]``
    keeps its label). A map equal to an earlier cluster's is drawn again, so the R maps differ;
    K labels allow (K-1)!! pairings for K even and K!! for K odd, so R - 1 may not exceed that.
    Each map is its own inverse: map[r][map[r][k]] == k.
    """
    available = _pairings(num_classes, limit=num_clusters)
    if num_clusters - 1 > available:
        raise DataError(
            f"label_swap:{num_clusters} needs {num_clusters - 1} distinct pairings of "
            f"{num_classes} labels besides the identity; there are only {available}"
        )
    maps = [np.arange(num_classes)]
    seen = {maps[0].tobytes()}
    while len(maps) < num_clusters:  # redraws only on a repeat: rare unless K is tiny
        order = rng.permutation(num_classes)
        pairs = order[: num_classes - num_classes % 2].reshape(-1, 2)
        swapped = np.arange(num_classes)
        swapped[pairs[:, 0]], swapped[pairs[:, 1]] = pairs[:, 1], pairs[:, 0]
        if swapped.tobytes() not in seen:
            seen.add(swapped.tobytes())
            maps.append(swapped)
    return np.stack(maps)


def _pairings(num_classes: int, limit: int) -> int:
    """How many ways K labels split into floor(K/2) disjoint pairs ((K-1)!! for K even, K!!
    for K odd; 0 for K = 1, whose only pairing, none, is the identity), counted up to
    `limit`."""
    if num_classes < 2:
        return 0
    count = 1
    for factor in range(num_classes - 1 if num_classes % 2 == 0 else num_classes, 1, -2):
        count *= factor
        if count >= limit:
            return count
    return count


def plant_rows(planted: str, x: np.ndarray, y: np.ndarray, row_cluster: np.ndarray,
               num_clusters: int, num_classes: int, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) with each row transformed by its cluster `row_cluster`: ``rotated`` turns the
    images (`rotate_images`), ``permuted`` and ``label_swap`` map the labels
    (`label_permutations`, `label_swaps`)."""
    if planted == "rotated":
        return rotate_images(x, row_cluster, num_clusters), y
    draw = label_permutations if planted == "permuted" else label_swaps
    maps = draw(num_clusters, num_classes, rng)
    return x, maps[row_cluster, y]
