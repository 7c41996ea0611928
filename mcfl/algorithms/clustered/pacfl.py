"""PACFL (Vahidian, Morafah, Wang, Kungurtsev, Chen, Shah and Lin, AAAI 2023, "Efficient
Distribution Similarity Identification in Clustered Federated Learning via Principal Angles
Between Client Data Subspaces"): one-shot clustering before any training.

Each client summarises its data by the top `pacfl_vectors` = p left singular vectors U_i
[d, p] of its data matrix D_i = [x_1 .. x_n] (features by samples; truncated SVD, Sec. 3.1)
and sends them once. The server's proximity between two clients is the smallest principal
angle between their subspaces (Eq. 2), theta_1 = arccos(sigma_max(U_i^T U_j)) in degrees, and
it clusters the proximity matrix by hierarchical clustering (average linkage): into the run's
K clusters, or, with `pacfl_threshold` beta > 0, merging while clusters are closer than beta
degrees (at most K). Each cluster then runs FedAvg (weighted by n_i) from W_0; assignments stay.

The SVD is exact, per client on its padded rows (cost ~ n_max d min(n_max, d) a client, once);
the proximity matrix and the linkage are [C, C] (O(C^3) time for the linkage), sized for the
hundreds to few thousands of clients of the paper's experiments.

Defaults: p = 3 singular vectors and exactly K clusters (the paper's beta threshold, which finds
the number of clusters, is ``threshold``). Label-free by design: under P(Y|X), where the images
of every group are alike, it cannot tell groups apart (ARI 0.5; REPRODUCTION.md, "Defaults
against each paper's setting").
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from mcfl.algorithms.clustered.shared import ClusterState, clustered_algorithm, fixed_cluster_round
from mcfl.algorithms.framework.base import FederatedAlgorithm, stack
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.clustering import agglomerative
from mcfl.engine.blocks import map_blocks
from mcfl.errors import ConfigError
from mcfl.settings import setting

# Clients whose subspaces are computed together (each holds its padded rows [n_max, d]).
SUBSPACE_BLOCK = 16


@dataclasses.dataclass(frozen=True)
class PACFLParams:
    vectors: int = setting(3, "p: left singular vectors of each client's data matrix sent "
                           "to the server (Sec. 3.1); at most half the features (more make "
                           "every angle 0: refused)", key="pacfl_vectors", minimum=1)
    threshold: float = setting(0.0, "beta: merge clusters closer than this many degrees (at "
                               "most K clusters); 0: exactly K clusters", key="pacfl_threshold",
                               minimum=0)


def check_vectors(p: int, features: int) -> None:
    """Refuse p vectors that cannot tell clients apart: two p-dimensional subspaces of R^d
    with 2p > d share a direction (their sum has at most d dimensions), so every smallest
    angle would be 0 (and p > d vectors do not exist)."""
    if 2 * p > features:
        allowed = (f"1 to {features // 2}" if features >= 4 else "1" if features >= 2 else
                   "none: PACFL needs at least 2 features")
        raise ConfigError(f"pacfl_vectors={p}: the data have {features} features, and two "
                          f"subspaces of {p} dimensions in {features} always share a "
                          f"direction, so every angle PACFL clusters by would be 0; allowed: "
                          f"{allowed}")


def client_subspaces(data, clients: jax.Array, p: int) -> jax.Array:
    """[S, d, p] the top-p left singular vectors of each client's data matrix (its training
    rows flattened, as columns), by an exact SVD of its rows padded with zeros (zero columns
    change no left singular vector of nonzero value)."""
    n_max = data.max_train_count

    def one_client(client):
        positions = data.train_offsets[client] + jnp.arange(n_max, dtype=jnp.int32)
        real = jnp.arange(n_max) < data.train_counts[client]
        rows = data.train_order[jnp.where(real, positions, 0)]
        x = data.x_train[rows].reshape(n_max, -1).astype(jnp.float32)
        x = jnp.where(real[:, None], x, 0.0)
        _, _, vt = jnp.linalg.svd(x, full_matrices=False)  # rows of vt: right vectors of x
        return vt[:p].T  # [d, p]: left singular vectors of D = x^T

    return map_blocks(lambda block: jax.vmap(one_client)(block["client"]),
                      {"client": clients}, SUBSPACE_BLOCK)


def smallest_angles(subspaces: jax.Array) -> jax.Array:
    """[C, C] smallest principal angle in degrees between every two subspaces [C, d, p]
    (cos theta_1 is the largest singular value of U_i^T U_j)."""
    def row(u):
        products = jnp.einsum("dp,cdq->cpq", u, subspaces)
        largest = jnp.linalg.svd(products, compute_uv=False)[:, 0]
        return jnp.degrees(jnp.arccos(jnp.clip(largest, 0.0, 1.0)))

    return jax.lax.map(row, subspaces)


@register("pacfl", PACFLParams, clustered=True, reference="Vahidian et al., 2023, PACFL",
          summary="one shot before training: clients send the top p left singular vectors of "
          "their data; hierarchical clustering (average linkage) of the smallest principal "
          "angles (Eq. 2) into K clusters (or under a threshold); FedAvg per cluster")
def pacfl(context: AlgorithmContext) -> FederatedAlgorithm:
    model, num_clusters = context.model, context.num_clusters

    def init(data, key, hp):
        check_vectors(hp.params.vectors, math.prod(data.x_train.shape[1:]))
        clients = jnp.arange(data.num_clients, dtype=jnp.int32)
        subspaces = client_subspaces(data, clients, hp.params.vectors)
        threshold = hp.params.threshold
        labels = agglomerative(smallest_angles(subspaces), num_clusters, method="average",
                               threshold=jnp.where(threshold > 0, threshold, -jnp.inf))
        models = stack(model.init(key), num_clusters)
        active = jnp.arange(num_clusters) <= jnp.max(labels)
        return ClusterState.create(models, labels, active)

    # (the subspaces sent at init are statistics of the data, not model updates: no
    # transform; the rounds are the skeleton's FedAvg inside each cluster)
    return clustered_algorithm(context, init, fixed_cluster_round(context))
