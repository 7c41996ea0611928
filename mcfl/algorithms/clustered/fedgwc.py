"""FedGWC (Licciardi, Leo, Fani, Caputo and Ciccone, ICML 2025, "Interaction-Aware Gaussian
Weighting for Clustered Federated Learning"; the authors' code davedleo/FedGWC,
agents/servers.py `ServerFedGWC`, whose steps mcfl follows).

Every cluster trains by FedAvg (weights n_i). Each sampled client reports the minibatch loss
of each of its local steps (taken before the step: the engine's `LocalTraining.record_losses`),
and the server turns every cluster's cohort of loss curves into Gaussian rewards:

1. per step t, the cohort's mean mu_t = sum_i w_i l_i^t and variance
   s2_t = sum_i w_i (l_i^t - mu_t)^2 (w_i = n_i / sum n); when the cohort has fewer than S
   (`fedgwc_loss_samples`) clients, S - m synthetic losses are drawn from N(mu_t, s2_t) and
   mu_t, s2_t become the plain mean and unbiased variance of the S rows;
   r_i = mean_t exp(-(l_i^t - mu_t)^2 / (2 (s2_t + 1e-16)));
2. the interaction matrix P of the cluster: for every ordered pair (i, j) of its cohort, i = j
   included, P[i, j] <- (1 - alpha) P[i, j] + alpha r_i / sum_k r_k, alpha = m / N_c (P starts
   at 1/N^2 everywhere); pairs not sampled together keep their value;
3. the running MSE of P's changes, upsilon <- (1 - alpha) upsilon + alpha sse / m^2 (from 1);
   the patience pi counts the rounds in a row with upsilon < eps (`fedgwc_eps`), reset to 0
   otherwise;
4. when pi reaches pi* the cluster is clustered: its clients are compared by the columns of P
   (their "unbiased perception vectors", the rewards the others obtained while sampled with
   them), min-max normalised over the cluster's entries; the affinity is
   A_ij = exp(-gamma sum_{k not in {i, j}} (P~[k, i] - P~[k, j])^2) (`fedgwc_gamma`),
   A_ii = 0; for n = 2 .. n_max, scikit-learn's spectral clustering (assign_labels
   "cluster_qr") gives labels and its spectral embedding (n components) the points their
   Davies-Bouldin index is computed on; the n of the smallest index is kept if that index is
   below 1 (`fedgwc_db_threshold`), and the cluster splits into its labels' groups, each child
   with a copy of the parent's model, its block of P, upsilon = 1, pi = 0. Otherwise nothing
   splits and upsilon = 1 (which resets pi the next round). Children go on being clustered
   while they have more than m clients: K is found, not given.

In mcfl, all of it is fixed shapes: the clusters live in K = --clusters slots (`ClusterState`,
`active` marking the ones in use), every client has a cluster label, and the clusters' N_c x N_c
interaction matrices are one [C, C] matrix whose entries count only between clients of one
cluster (a split leaves every child its block). The spectral clustering is JAX's: the
eigendecomposition of the cluster's normalised Laplacian (the other clients' rows put above its
spectrum), scikit-learn's `cluster_qr` (column-pivoted QR, polar rotation) and its
Davies-Bouldin index, checked against scikit-learn in tests/test_fedgwc.py. The splits of a
round run one cluster after another (a `lax.fori_loop` under a `lax.cond` taken only when some
cluster is due), as the authors' loop over clusters does.

Where mcfl differs from the authors' code, and why:

* Participation. The code samples m = round(rho N) clients in every cluster every round, so a
  round trains more clients as clusters multiply. mcfl's participation is the run's (one
  sample of --clients-per-round S clients, `base.sampled`, which every algorithm shares and a
  client store or the system model acts on), and a cluster's cohort is its sampled members:
  about S N_c / N of them. So alpha = (its cohort) / N_c, the fraction the round saw, as the
  code's m / N_c is; the MSE divides by (its cohort)^2 as the code's by m^2; and the patience
  target pi* = round(N / S), the rounds in which a cluster's members are sampled once on
  average, as the code's round(N_c / m) is.
* The split rules' m. The code's m also sizes the splits (n_max = min(floor(N_c / m) + 1, 5),
  candidates 2 .. n_max - 1; a cluster splits only while N_c > m). Tied to the run's S, every
  cluster of a run with all clients every round would have N_c <= m and never split; mcfl
  takes m = round(rho N) from its own share rho (`fedgwc_split_share`, the code's default
  participation rate 0.1). The candidates are n = 2 .. min(floor(N_c / m), `fedgwc_max_split`
  (the code's 4), 1 + the free slots): a split needs a free slot for each new cluster (with
  --clusters 1 nothing splits).
* Synthetic losses: the code draws S - m whenever S > m, with its fixed m; mcfl draws
  S - (the cohort that reached step t) for each step. Rewards are averaged over the steps each
  client took (a client under --local-epochs, or stopped by the system model's deadline, may
  take fewer steps than another; with --local-steps tau, the code's num_local_iters, every
  client takes tau). Losses are shifted by the cohort's smallest one before the statistics
  (rewards do not change; identical curves then give r = 1 exactly in float32).
* A split's children are its non-empty labels (the code makes a child, with no clients, for a
  label nobody got). When every client's perception vector is the same (the affinity is
  constant: a constant P, or every client of the cluster sampled every round, where each update
  writes r_i / sum r along the whole row i, so all columns agree), nothing splits: the
  eigenvectors are then any basis of a repeated eigenvalue and scikit-learn's labels arbitrary.
  FedGWC's information is in who was sampled with whom: with all clients every round it never
  splits.
* Only the clients that report (`Exchange.present`) and take a step form a cohort; a cluster
  none of whose members reported keeps its P, upsilon and pi.
* Local training records its step losses, so it runs on the per-client path (not the factored
  fast paths; `--low-rank` is off for FedGWC).
* Not implemented: the code's `fairavg` and `fedopt` aggregations and its `explore` sampling
  (counters never incremented there, so uniform).

Besides the clustered algorithms' metrics a round reports `splits` (clusters split in it),
`interaction_mse` (the smallest running MSE of a cluster that may split; 1 when none may) and
`mean_reward` (over the cohorts). The server reads each client's loss curve: refused under DP.
P is the server's [C, C] float32 (4 C^2 bytes: 40 MB for 3,162 clients), and a clustering
costs an eigendecomposition of a C x C matrix and O(C^3) for the affinity.

Defaults: the authors' code's configuration (gamma 0.1, eps 1e-5, S = 10, rho 0.1, at most 4
clusters a split, Davies-Bouldin below 1), made for 10% of 100 clients a round over 10,000
rounds. Clustering needs many rounds: the running MSE starts at 1 and decays by (1 - alpha) a
round, and a pair of clients is compared only through the rounds they were sampled in together.
With every client every round the perception vectors are all the same and nothing splits
(tested); with 20 of 240 clients a round it did not split in 300 rounds at eps 1e-5 or 1e-3
(REPRODUCTION.md, "Defaults against each paper's setting").
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.algorithms.clustered.shared import (
    ClusterState,
    cluster_client_models,
    cluster_count,
    cluster_server,
    cluster_sizes,
    cluster_start,
)
from mcfl.algorithms.framework.base import FederatedAlgorithm, sampled, stack, training_key
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import aggregate
from mcfl.clustering.distances import HIGHEST
from mcfl.engine import ceil_div, occasional_cond
from mcfl.settings import setting

VARIANCE_FLOOR = 1e-16  # the code's s2_t += 1e-16
RANGE_FLOOR = 1e-8  # the code's min-max normalisation divides by max(range, 1e-8)
NEAR_ZERO = 1e-8  # scikit-learn's Davies-Bouldin: np.isclose(x, 0) (atol 1e-8)
OUTSIDE = 3.0  # a non-member's Laplacian diagonal: above every member eigenvalue (<= 2)


@dataclasses.dataclass(frozen=True)
class FedGWCParams:
    gamma: float = setting(0.1, "gamma: width of the RBF affinity between clients' perception "
                           "vectors (the code's config default 0.1)", key="fedgwc_gamma",
                           above=0)
    eps: float = setting(1e-5, "eps: a cluster's interaction matrix is stable while the running "
                         "MSE of its changes is below eps; pi* stable rounds in a row cluster it",
                         key="fedgwc_eps", above=0)
    loss_samples: int = setting(10, "S: a cohort of fewer than S clients is topped up with "
                                "synthetic losses from N(mu_t, s2_t) before the rewards' "
                                "statistics (0: never)", key="fedgwc_loss_samples", minimum=0)
    max_split: int = setting(4, "most clusters one split makes (the code tries n = 2..4)",
                             key="fedgwc_max_split", minimum=2)
    db_threshold: float = setting(1.0, "a split is kept only when its Davies-Bouldin index is "
                                  "below this", key="fedgwc_db_threshold", above=0)
    split_share: float = setting(0.1, "rho: the split rules' m = round(rho N) (the code's "
                                 "participation rate): a cluster of N_c > m clients splits into "
                                 "at most floor(N_c / m) clusters", key="fedgwc_split_share",
                                 above=0, maximum=1)


class FedGWCState(flax.struct.PyTreeNode):
    """The clusters (`ClusterState`: K slots, `active` those in use; at first one cluster, slot
    0, with every client) and what decides their splits: the interaction matrix `interaction`
    [C, C] (entry (i, j) counts while i and j share a cluster), each slot's running MSE
    `mse` [K] (upsilon) and patience `patience` [K] int32 (pi)."""

    clusters: ClusterState
    interaction: jax.Array
    mse: jax.Array
    patience: jax.Array


def gaussian_rewards(losses: jax.Array, valid: jax.Array, weights: jax.Array,
                     segments: jax.Array, cohort: jax.Array, num_clusters: int, samples: int,
                     key: jax.Array) -> jax.Array:
    """[S] each client's Gaussian reward in its cluster's cohort (the code's
    `_get_gaussian_rewards`), 0 outside a cohort: `losses` [S, L] its step losses, `valid`
    [S, L] the steps it took, `weights` [S] its training rows n_i, `segments` [S] its cluster,
    `cohort` [S] whether it is in its cluster's cohort; `samples` (static) the S below which a
    cohort is topped up with synthetic losses drawn under `key`."""
    live = valid & cohort[:, None]  # [S, L]
    onehot = jax.nn.one_hot(segments, num_clusters, dtype=jnp.float32)  # [S, K]

    def per_cluster(x):  # [S, L] -> [K, L] sums over each cluster's cohort
        return jnp.matmul(onehot.T, x, precision=HIGHEST)

    # shifted by the cohort's smallest loss at each step: the same rewards, and an exact 0 for
    # identical curves
    low = jnp.min(jnp.where(live[:, None, :] & (onehot[:, :, None] > 0), losses[:, None, :],
                            jnp.inf), axis=0)  # [K, L]
    low = jnp.where(jnp.isfinite(low), low, 0.0)
    x = jnp.where(live, losses - low[segments], 0.0)
    w = jnp.where(live, weights.astype(jnp.float32)[:, None], 0.0)
    total = per_cluster(w)
    mu = per_cluster(w * x) / jnp.maximum(total, 1e-30)
    s2 = per_cluster(w * jnp.square(x - mu[segments])) / jnp.maximum(total, 1e-30)
    if samples > 0:
        count = per_cluster(live.astype(jnp.float32))  # [K, L]
        extra = samples - count
        drawn = (mu[:, None, :] + jnp.sqrt(s2)[:, None, :]
                 * jax.random.normal(key, (num_clusters, samples, x.shape[1])))
        used = jnp.arange(samples)[None, :, None] < extra[:, None, :]  # [K, samples, L]
        mean = (jnp.sum(jnp.where(used, drawn, 0.0), axis=1) + per_cluster(x)) / samples
        squares = (jnp.sum(jnp.where(used, jnp.square(drawn - mean[:, None, :]), 0.0), axis=1)
                   + per_cluster(jnp.where(live, jnp.square(x - mean[segments]), 0.0)))
        topped = extra > 0
        mu = jnp.where(topped, mean, mu)
        s2 = jnp.where(topped, squares / max(samples - 1, 1), s2)
    s2 = s2 + VARIANCE_FLOOR
    kernel = jnp.exp(-0.5 * jnp.square(x - mu[segments]) / s2[segments])  # [S, L]
    steps = jnp.sum(live, axis=1)
    reward = jnp.sum(jnp.where(live, kernel, 0.0), axis=1) / jnp.maximum(steps, 1)
    return jnp.where(cohort, reward, 0.0)


def updated_interaction(interaction: jax.Array, clients: jax.Array, segments: jax.Array,
                        cohort: jax.Array, rewards: jax.Array, alpha: jax.Array,
                        num_clusters: int) -> tuple[jax.Array, jax.Array]:
    """The interaction matrix [C, C] after a round (the code's `_update_W`): for every ordered
    pair (i, j) of one cluster's cohort (i = j included),
    ``P[i, j] <- (1 - alpha_c) P[i, j] + alpha_c r_i / sum_{k in the cohort} r_k``, with
    `alpha` [K] per cluster; and [K] each cluster's sum of the squared changes."""
    onehot = jax.nn.one_hot(segments, num_clusters, dtype=jnp.float32)
    totals = jnp.matmul(onehot.T, jnp.where(cohort, rewards, 0.0), precision=HIGHEST)  # [K]
    share = rewards / jnp.maximum(totals[segments], 1e-30)  # [S]
    a = alpha[segments]
    old = interaction[clients[:, None], clients[None, :]]  # [S, S]
    new = (1.0 - a)[:, None] * old + (a * share)[:, None]
    pairs = cohort[:, None] & cohort[None, :] & (segments[:, None] == segments[None, :])
    change = jnp.where(pairs, new - old, 0.0)
    # (added, not set: a client listed twice, a Poisson round's filler, is outside the cohort)
    interaction = interaction.at[clients[:, None], clients[None, :]].add(change)
    sse = jnp.matmul(onehot.T, jnp.sum(jnp.square(change), axis=1), precision=HIGHEST)
    return interaction, sse


def stability(mse: jax.Array, patience: jax.Array, alpha: jax.Array, sse: jax.Array,
              cohort_sizes: jax.Array, eps, updated: jax.Array):
    """([K] running MSE, [K] patience) after a round, for the clusters `updated` (the others as
    they were): ``upsilon <- (1 - alpha) upsilon + alpha sse / m^2`` and the patience one more
    while upsilon < eps, else 0."""
    round_mse = sse / jnp.maximum(jnp.square(cohort_sizes.astype(jnp.float32)), 1.0)
    new = (1.0 - alpha) * mse + alpha * round_mse
    mse = jnp.where(updated, new, mse)
    stable = jnp.where(mse < eps, patience + 1, 0)
    return mse, jnp.where(updated, stable, patience).astype(jnp.int32)


def affinity(interaction: jax.Array, members: jax.Array, gamma) -> jax.Array:
    """[C, C] the RBF affinity between the `members` [C] of one cluster (the code's
    `_compute_P`): with X the transposed interaction matrix min-max normalised over the members'
    entries (row i: client i's perception vector, the rewards the others obtained with it),
    ``A_ij = exp(-gamma sum_{k member, k not in {i, j}} (X_ik - X_jk)^2)`` for members i != j,
    0 elsewhere."""
    pair = members[:, None] & members[None, :]
    low = jnp.min(jnp.where(pair, interaction, jnp.inf))
    high = jnp.max(jnp.where(pair, interaction, -jnp.inf))
    x = (interaction.T - low) / jnp.maximum(high - low, RANGE_FLOOR)
    clients = jnp.arange(members.shape[0])

    def row(i):  # [C] distances of client i to every j, coordinate by coordinate (identical
        # vectors give exactly 0, which `best_split` reads), O(C^2) memory
        keep = members[None, :] & (clients[None, :] != i) & (clients[None, :] != clients[:, None])
        return jnp.sum(jnp.where(keep, jnp.square(x[i][None, :] - x), 0.0), axis=1)

    d2 = jax.lax.map(row, clients)
    return jnp.where(pair & (clients[:, None] != clients[None, :]), jnp.exp(-gamma * d2), 0.0)


def spectral_vectors(adjacency: jax.Array, members: jax.Array, count: int) -> jax.Array:
    """[C, count] the members' `count` leading spectral vectors of `adjacency` as
    scikit-learn's `spectral_embedding` makes them (before its sign flip): the eigenvectors of
    the `count` smallest eigenvalues of the normalised Laplacian (diagonal 1), divided by the
    square root of each node's degree (1 for an isolated node); 0 at the other clients, whose
    rows of the Laplacian are put above the members' spectrum."""
    degree = jnp.sum(adjacency, axis=1)
    root = jnp.where(degree > 0, jnp.sqrt(degree), 1.0)
    diagonal = jnp.where(members, 1.0, OUTSIDE)
    laplacian = jnp.diag(diagonal) - adjacency / (root[:, None] * root[None, :])
    _, vectors = jnp.linalg.eigh(laplacian)  # ascending
    return jnp.where(members[:, None], vectors[:, :count] / root[:, None], 0.0)


def cluster_qr(vectors: jax.Array) -> jax.Array:
    """[C] labels of the rows of `vectors` [C, n] by scikit-learn's `cluster_qr` (Damle, Minden
    and Ying 2019): n rows chosen by column-pivoted QR of vectors^T (the largest remaining
    norm each time; all-zero rows are never chosen while another is not), the polar factor
    U V^T of those rows' transpose rotates every row, and each takes its largest absolute
    coordinate."""
    n = vectors.shape[1]
    residual, chosen = vectors, []
    for _ in range(n):  # n (static) is at most --fedgwc-max-split
        norms = jnp.sum(jnp.square(residual), axis=1)
        pivot = jnp.argmax(norms)
        unit = residual[pivot] / jnp.sqrt(jnp.maximum(norms[pivot], 1e-30))
        residual = residual - jnp.outer(jnp.matmul(residual, unit, precision=HIGHEST), unit)
        chosen.append(pivot)
    u, _, vt = jnp.linalg.svd(vectors[jnp.stack(chosen)].T)
    rotated = jnp.matmul(vectors, jnp.matmul(u, vt, precision=HIGHEST), precision=HIGHEST)
    return jnp.argmax(jnp.abs(rotated), axis=1).astype(jnp.int32)


def davies_bouldin(points: jax.Array, labels: jax.Array, members: jax.Array,
                   num_labels: int) -> jax.Array:
    """The Davies-Bouldin index of the `members`' `points` [C, d] under `labels` [C] (values
    below `num_labels`, empty ones left out), as scikit-learn's `davies_bouldin_score`: 0 when
    every cluster's spread or every centroid distance is 0; inf when fewer than 2 or more than
    (members - 1) labels are used (scikit-learn refuses those)."""
    onehot = jax.nn.one_hot(labels, num_labels, dtype=jnp.float32) * members[:, None]
    counts = jnp.sum(onehot, axis=0)
    used = counts > 0
    centroids = jnp.matmul(onehot.T, points, precision=HIGHEST) / jnp.maximum(counts, 1)[:, None]
    spread = jnp.linalg.norm(points - centroids[labels], axis=1)
    intra = jnp.matmul(onehot.T, spread, precision=HIGHEST) / jnp.maximum(counts, 1)
    gaps = jnp.linalg.norm(centroids[:, None, :] - centroids[None, :, :], axis=2)
    both = used[:, None] & used[None, :]
    degenerate = (jnp.all(jnp.where(used, intra <= NEAR_ZERO, True))
                  | jnp.all(jnp.where(both, gaps <= NEAR_ZERO, True)))
    # (i = j left out by name: XLA may compute a centroid's distance to itself as 1e-9)
    apart = both & ~jnp.eye(num_labels, dtype=bool) & (gaps > 0)
    ratios = jnp.where(apart, (intra[:, None] + intra[None, :])
                       / jnp.where(apart, gaps, 1.0), 0.0)
    n_used = jnp.sum(used)
    index = jnp.sum(jnp.where(used, jnp.max(ratios, axis=1), 0.0)) / jnp.maximum(n_used, 1)
    index = jnp.where(degenerate, 0.0, index)
    allowed = (n_used >= 2) & (n_used <= jnp.sum(members) - 1)
    return jnp.where(allowed, index, jnp.inf)


def best_split(interaction: jax.Array, members: jax.Array, gamma, largest,
               most: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One cluster's clustering (the code's `_find_best_clusters`): for n = 2 .. `largest`
    (traced, at most `most`, static) the spectral clustering's labels and the Davies-Bouldin
    index of them on the n-component spectral embedding (the leading vector dropped). Returns
    the labels [C] of the n with the smallest index (the smallest n on ties), that index
    (inf when no n is allowed or every perception vector is the same) and [most - 1] the
    indices of n = 2 .. most (inf beyond `largest`)."""
    adjacency = affinity(interaction, members, gamma)
    pair = members[:, None] & members[None, :] & ~jnp.eye(members.shape[0], dtype=bool)
    flat = (jnp.max(jnp.where(pair, adjacency, -jnp.inf))
            <= jnp.min(jnp.where(pair, adjacency, jnp.inf)))
    vectors = spectral_vectors(adjacency, members, most + 1)  # [C, most + 1]
    labels, scores = [], []
    for n in range(2, most + 1):
        found = cluster_qr(vectors[:, :n])
        index = davies_bouldin(vectors[:, 1:n + 1], found, members, n)
        labels.append(found)
        scores.append(jnp.where(n <= largest, index, jnp.inf))
    scores = jnp.where(flat, jnp.inf, jnp.stack(scores))
    best = jnp.argmin(scores)
    return jnp.stack(labels)[best], scores[best], scores


def split_slots(assignment: jax.Array, active: jax.Array, members: jax.Array,
                labels: jax.Array, cluster, most: int) -> tuple[jax.Array, jax.Array]:
    """The assignment [C] after cluster `cluster` splits its `members` by `labels` (values
    below `most`): its first non-empty label keeps the slot, the next ones take the free slots
    in order; and [K] the slots of the children (the parent's included)."""
    k = active.shape[0]
    present = jnp.any((labels[:, None] == jnp.arange(most)[None, :]) & members[:, None],
                      axis=0)  # [most]
    rank = jnp.cumsum(present) - 1
    order = jnp.argsort(jnp.where(active, k, 0) + jnp.arange(k))  # the free slots first
    targets = jnp.concatenate([jnp.asarray([cluster]), order]).astype(jnp.int32)
    slot_of = targets[jnp.clip(rank, 0, k)]  # [most]
    assignment = jnp.where(members, slot_of[labels], assignment)
    children = jnp.zeros((k,), bool).at[jnp.where(present, slot_of, k)].set(True, mode="drop")
    return assignment, children


def split_due(state: FedGWCState, due: jax.Array, params: FedGWCParams,
              m) -> tuple[FedGWCState, jax.Array]:
    """`state` after clustering each cluster that is `due` [K], one after another (a split
    takes free slots the next one then lacks); and the number of clusters that split."""
    num_slots = due.shape[0]
    most = params.max_split

    def attempt(k, carry):
        s, splits = carry
        c = s.clusters
        members = c.assignment == k
        largest = jnp.minimum(c.sizes[k] // m, 1 + jnp.sum(~c.active))
        labels, index, _ = best_split(s.interaction, members, params.gamma, largest, most)
        keep = index < params.db_threshold
        assignment, children = split_slots(c.assignment, c.active, members, labels, k, most)
        parent = jax.tree.map(lambda x: x[k], c.models)
        models = jax.tree.map(
            lambda x, p: jnp.where(children.reshape((-1,) + (1,) * p.ndim), p[None], x),
            c.models, parent)
        split = c.replace(models=models, assignment=assignment, active=c.active | children,
                          sizes=cluster_sizes(assignment, num_slots))
        kept = s.replace(clusters=split, mse=jnp.where(children, 1.0, s.mse),
                         patience=jnp.where(children, 0, s.patience))
        refused = s.replace(mse=s.mse.at[k].set(1.0))
        return jax.lax.cond(keep, lambda: (kept, splits + 1), lambda: (refused, splits))

    def body(k, carry):
        return jax.lax.cond(due[k], lambda: attempt(k, carry), lambda: carry)

    return jax.lax.fori_loop(0, num_slots, body, (state, jnp.zeros((), jnp.int32)))


def recording(training, data):
    """The clients' local training with each step's loss recorded (as many steps as the
    longest client takes), on the per-client path."""
    steps = training.local_steps or training.local_epochs * ceil_div(data.max_train_count,
                                                                     training.batch_size)
    return training.replace(record_losses=max(int(steps), 1)).per_client()


@register("fedgwc", FedGWCParams, clustered=True,
          reference="Licciardi et al., 2025, FedGWC",
          summary="FedAvg per cluster; each client's step losses give a Gaussian reward "
          "(closeness to its cohort's per-step mean), accumulated per pair of clients sampled "
          "together into an interaction matrix; once it is stable, spectral clustering of its "
          "columns with the number of clusters by Davies-Bouldin splits a cluster, "
          "recursively, up to K = --clusters")
def fedgwc(context: AlgorithmContext) -> FederatedAlgorithm:
    """FedGWC with at most ``context.num_clusters`` clusters (the module docstring)."""
    model, num_slots = context.model, context.num_clusters
    per_round = context.clients_per_round

    def init(data, key, hp):
        del hp
        count = data.num_clients
        clusters = ClusterState.create(stack(model.init(key), num_slots),
                                       jnp.zeros((count,), jnp.int32),
                                       jnp.arange(num_slots) == 0)
        return FedGWCState(clusters, jnp.full((count, count), 1.0 / count ** 2, jnp.float32),
                           jnp.ones((num_slots,), jnp.float32),
                           jnp.zeros((num_slots,), jnp.int32))

    def server(state, summed, data, hp, key):
        params = hp.params
        before = state.clusters
        clusters, metrics = cluster_server(before, summed, data, hp, num_slots)
        stats, clients, segments = summed.stats, summed.clients, summed.segments
        reported = (jnp.ones(clients.shape, bool) if stats.reported is None
                    else stats.reported > 0)
        m = jnp.maximum(jnp.round(params.split_share * data.num_clients), 1).astype(jnp.int32)
        splittable = before.active & (before.sizes > m)
        cohort = reported & (stats.steps > 0) & splittable[segments]
        cohort_sizes = jnp.sum(jax.nn.one_hot(segments, num_slots, dtype=jnp.int32)
                               * cohort[:, None], axis=0)  # [K]
        alpha = cohort_sizes / jnp.maximum(before.sizes, 1).astype(jnp.float32)
        steps = stats.step_losses.shape[1]
        valid = jnp.arange(steps)[None, :] < stats.steps[:, None]
        rewards = gaussian_rewards(stats.step_losses, valid, data.train_counts[clients],
                                   segments, cohort, num_slots, params.loss_samples, key)
        interaction, sse = updated_interaction(state.interaction, clients, segments, cohort,
                                               rewards, alpha, num_slots)
        updated = splittable & (cohort_sizes > 0)
        mse, patience = stability(state.mse, state.patience, alpha, sse, cohort_sizes,
                                  params.eps, updated)
        target = max(1, round(data.num_clients / per_round))  # pi*
        due = updated & (patience == target)
        state = state.replace(clusters=clusters, interaction=interaction, mse=mse,
                              patience=patience)
        state, splits = occasional_cond(
            jnp.any(due), lambda s: split_due(s, due, params, m),
            lambda s: (s, jnp.zeros((), jnp.int32)), state)
        metrics["num_clusters"] = cluster_count(state.clusters.sizes)
        metrics["splits"] = splits.astype(jnp.float32)
        # the smallest running MSE of a cluster that may split (1: none may)
        metrics["interaction_mse"] = jnp.min(jnp.where(splittable, state.mse, 1.0))
        metrics["mean_reward"] = (jnp.sum(rewards) / jnp.maximum(jnp.sum(cohort), 1))
        return state, metrics

    def round_(state, data, key, hp, exchange):
        # the skeleton's stages (`skeleton.round_of`), with a key for the synthetic losses
        train_key = training_key(key)  # (the first half chose the participants)
        synthetic_key = jax.random.split(key, 3)[2]
        begun = cluster_start(state.clusters, data, exchange.clients, hp, num_slots)
        begun = begun._replace(training=recording(hp.training, data))
        summed, exchange = aggregate(context, begun, data, train_key, hp, exchange)
        state, metrics = server(state, summed, data, hp, synthetic_key)
        return state, metrics, exchange

    return FederatedAlgorithm(init, sampled(per_round), round_,
                              lambda state, data=None: cluster_client_models(state.clusters),
                              lambda state: state.clusters.assignment)
