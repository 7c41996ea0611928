"""Shared pieces of the clustered algorithms: state, features, metrics."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from mcfl.algorithms.framework.base import (
    ClientModels,
    ClientState,
    FederatedAlgorithm,
    sampled,
    shared_models,
    training_metrics,
)
from mcfl.algorithms.framework.registry import AlgorithmContext
from mcfl.algorithms.framework.skeleton import Aggregate, Start, round_of
from mcfl.engine import (
    ClientStats,
    RoundClients,
    segment_mean,
    segment_sums,
)

# The model a client is evaluated with: its cluster's now, or the one it started its last
# round from (what FlexCFL's authors' code tests each client with: their group.py keeps a
# client's `latest_params`, the group model it last received).
EVALUATIONS = ("current", "last_received")


class ClusterState(flax.struct.PyTreeNode):
    """K cluster models stacked [K, ...] and every client's cluster [C] int32.

    `active` [K] marks clusters in use (CFL grows its clusters into free slots; the others use
    all K); `round` counts rounds done; `sizes` [K] int32 counts each cluster's clients, kept
    up to date with the assignment (`reassign`) so that no round recounts the population;
    `received` [C, ...], kept only when clients are evaluated with ``last_received``, the
    model each client started its last round from (`record_received`).
    """

    models: object
    assignment: jax.Array
    active: jax.Array
    round: jax.Array
    sizes: jax.Array
    received: object  # None unless kept

    @classmethod
    def create(cls, models, assignment: jax.Array, active: jax.Array,
               evaluate_with: str = "current") -> ClusterState:
        """With ``evaluate_with="last_received"``, every client has received its cluster's
        model (`assignment` puts every client in one)."""
        num_clusters = active.shape[0]
        received = None
        if evaluate_with == "last_received":
            received = jax.tree.map(lambda m: m[assignment], models)
        return cls(models, assignment, active, jnp.zeros((), jnp.int32),
                   cluster_sizes(assignment, num_clusters), received)


def write_received(received, models, clients: jax.Array, start: jax.Array):
    """`received` [C, ...] with the rows of `clients` [S] set to their start models:
    `models` [M, ...] at rows `start` [S]."""
    return jax.tree.map(lambda rows, m: rows.at[clients].set(m[start]), received, models)


def record_received(state: ClusterState, clients: jax.Array, start: jax.Array) -> ClusterState:
    """`state` with `clients` [S] having received the models of clusters `start` [S] (the ones
    they start this round from, before the round updates them); as it is when `received` is
    not kept."""
    if state.received is None:
        return state
    return state.replace(received=write_received(state.received, state.models, clients, start))


def own_models(received):
    """Every client evaluated with its own model: `received` [C, ...] and client i's row i."""
    return received, jnp.arange(jax.tree.leaves(received)[0].shape[0], dtype=jnp.int32)


def cluster_client_models(state: ClusterState, data=None) -> ClientModels:
    """The models clients are evaluated with and each client's row of them: its cluster's, or
    with `received` kept, its own last received model."""
    del data
    newcomers = (state.models, None)  # a client that never trained: any cluster's model
    if state.received is not None:
        return shared_models(*own_models(state.received), newcomers=newcomers)
    return shared_models(state.models, state.assignment, newcomers=newcomers)


def cluster_sizes(assignment: jax.Array, num_clusters: int) -> jax.Array:
    """[K] clients in each cluster (-1, not yet in a cluster, counts in none). O(C): for
    initialisation; rounds update sizes with `reassign`."""
    return jax.nn.one_hot(assignment, num_clusters, dtype=jnp.int32).sum(0)


def reassign(assignment: jax.Array, sizes: jax.Array, clients: jax.Array, new: jax.Array):
    """`clients` (distinct) move to clusters `new`: the new assignment [C] and sizes [K],
    at a cost of O(len(clients)), not O(C)."""
    num_clusters = sizes.shape[0]
    old = assignment[clients]
    moved = (jax.nn.one_hot(new, num_clusters, dtype=jnp.int32).sum(0)
             - jax.nn.one_hot(old, num_clusters, dtype=jnp.int32).sum(0))
    return assignment.at[clients].set(new), sizes + moved


def last_dense_kernel(params) -> jax.Array:
    """The flattened kernel of the last dense layer (FeSEM authors' code clusters on it)."""
    dense = sorted((k for k in params if k.startswith("Dense_")), key=lambda k: int(k[6:]))
    return params[dense[-1]]["kernel"].reshape(-1)


def features_fn(last_layer: bool):
    """Per-model feature vector for clustering: all parameters, or the last dense kernel."""
    if last_layer:
        return last_dense_kernel
    return lambda params: ravel_pytree(params)[0]


def stacked_features(models, last_layer: bool) -> jax.Array:
    """[n, d] features of a stacked tree of models [n, ...]."""
    return jax.vmap(features_fn(last_layer))(models)


def flat_models(models) -> jax.Array:
    """[n, d] all parameters of each model of a stacked tree [n, ...], flattened."""
    return stacked_features(models, last_layer=False)


def unravel_rows(flat: jax.Array, like) -> object:
    """[n, d] flattened models back to a stacked tree [n, ...] shaped like the model `like`."""
    _, unravel = ravel_pytree(like)
    return jax.vmap(unravel)(flat)


def cluster_means(models, labels: jax.Array, num_clusters: int, weights=None):
    """[K, ...] (weighted) mean of the stacked `models` [n, ...] in each cluster of `labels`;
    an empty cluster gets zeros."""
    weights = jnp.ones(labels.shape, jnp.float32) if weights is None else weights
    sums, weight_sums = segment_sums(models, labels, weights, num_clusters)
    zeros = jax.tree.map(lambda s: jnp.zeros_like(s), sums)
    return segment_mean(sums, weight_sums, zeros)


def intra_cluster_distance(sums, weight_sums, stats: ClientStats, weights) -> jax.Array:
    """Weighted mean of ||W_i - W~_{r_i}||^2 over the round's clients after the M-step
    (FeSEM Eq. 6's second term), from streamed sums: for each cluster,
    sum_i w_i ||W_i||^2 - W_k ||mean_k||^2 with mean_k = sums_k / W_k."""
    center_sq = sum(
        jnp.sum(jnp.square(s.reshape(s.shape[0], -1)), axis=1) for s in jax.tree.leaves(sums)
    )
    between = jnp.sum(jnp.where(weight_sums > 0, center_sq / jnp.maximum(weight_sums, 1e-30), 0))
    w = weights.astype(jnp.float32)
    total = jnp.sum(w * stats.sq_norm) - between
    return jnp.maximum(total, 0.0) / jnp.maximum(jnp.sum(w), 1e-30)


def cluster_count(sizes: jax.Array) -> jax.Array:
    """Number of clusters holding at least one client."""
    return jnp.sum(sizes > 0).astype(jnp.float32)


def cluster_start(state, data, clients, hp, num_clusters: int) -> Start:
    """Stage (b) of FedAvg inside each cluster with the clients' clusters kept (after a one-shot
    clustering: FL+HC, PACFL; Robust's): the sampled clients start from their cluster's
    model and are summed into it, weighted by n_i."""
    del hp
    cluster = state.assignment[clients]
    return Start(state.models, RoundClients(clients, cluster), data.train_counts[clients],
                 cluster, num_clusters)


def cluster_server(state, summed: Aggregate, data, hp, num_clusters: int):
    """Stage (f) of the clustered algorithms that average per cluster: each cluster's new model
    is its segment's mean (a cluster nobody joined keeps its model), the clients move to the
    segments their messages were summed into, and the round's metrics (FeSEM Eq. 6's intra-
    cluster distance from the streamed sums)."""
    del hp
    models = segment_mean(summed.sums, summed.weight_sums, state.models)
    assignment, sizes = reassign(state.assignment, state.sizes, summed.clients, summed.segments)
    metrics = training_metrics(data.train_counts[summed.clients], summed.stats)
    metrics["intra_cluster_distance"] = intra_cluster_distance(
        summed.sums, summed.weight_sums, summed.stats, summed.weights)
    metrics["num_clusters"] = cluster_count(sizes)
    new_state = state.replace(models=models, assignment=assignment, sizes=sizes,
                              round=state.round + 1)
    return new_state, metrics


def fixed_cluster_round(context: AlgorithmContext):
    """A round of FedAvg inside each cluster with the clients' clusters kept: the skeleton's
    round with `cluster_start` and `cluster_server`."""
    k = context.num_clusters
    return round_of(context, lambda *a: cluster_start(*a, k), lambda *a: cluster_server(*a, k))


def clustered_algorithm(context: AlgorithmContext, init, round_, start=None,
                        participants=None, client_models=cluster_client_models
                        ) -> FederatedAlgorithm:
    """A FederatedAlgorithm over a ClusterState: a client is evaluated with its cluster's
    model, sampled `context.clients_per_round` a round unless `participants` says otherwise.
    `start`: an initialisation that trains every client once (`PopulationStart`), whose
    points a client store keeps in ``context.store_dtype``."""
    client_state = None if start is None else ClientState(dtype=context.store_dtype,
                                                          start=start)
    return FederatedAlgorithm(init, participants or sampled(context.clients_per_round), round_,
                              client_models, lambda s: s.assignment, client_state)
