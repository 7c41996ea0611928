"""FedSoft (Ruan and Joe-Wong, AAAI 2022, "FedSoft: Soft Clustered Federated Learning with
Proximal Local Updating"), Algorithm 1.

K centers c_s are trained from clients whose data may mix several of them. Every `interval`
rounds each client estimates its importance weights u_ks, the share of its training rows on
which center s has the lowest loss, floored at the counter smoother sigma and renormalised.
A sampled client k trains its own local model w_k on the proximal objective

    h_k(w) = f_k(w) + (lambda / 2) sum_s u_ks ||w - c_s||^2
           = f_k(w) + (lambda / 2) ||w - c_bar_k||^2 + const,   c_bar_k = sum_s u_ks c_s

(sum_s u_ks = 1), so its local solver is FedProx's toward c_bar_k. Center s becomes the mean of
the round's local models weighted by u_ks n_k, the paper's aggregation weights. mcfl samples
the round's clients uniformly, as every algorithm here does; the paper samples clients for
each center with probability proportional to u_ks n_k and takes their plain mean: both
estimate sum_k u_ks n_k w_k / sum_k u_ks n_k.

Local models are rows of the run's client store (`mcfl.algorithms.framework.stored`) and persist
from round to round; a client that has not trained yet starts from (and is evaluated with) c_bar_k.
Each client is evaluated with its local model, the paper's personalised model, or, with
`fedsoft_evaluate center`, with the center of its largest u_ks (the paper also scores the
centers); its cluster, for the ARI, is its largest u_ks. The K centers start from K
independent random initialisations (with one, every row ties and they never part).

Defaults: lambda 0.1 (the paper tunes it), tau = 2 rounds between importance estimates and sigma
= 1e-4; each client is scored with its local model, the paper's personalised one (84.7 / 78.9
accuracy against 70.1 / 58.5 with the centers, P(X|Y) / P(Y|X); REPRODUCTION.md, "Defaults
against each paper's setting").
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.algorithms.clustered.shared import cluster_count
from mcfl.algorithms.framework.base import (
    ClientState,
    FederatedAlgorithm,
    RowModels,
    sampled,
    training_key,
    training_metrics,
)
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import as_messages, columns_mean_of
from mcfl.algorithms.personalised.apfl import mixture
from mcfl.data.federated import FederatedData
from mcfl.engine import (
    CLIENT_ROWS_CHUNK,
    ApplyFn,
    PyTree,
    RoundClients,
    Start,
    occasional_cond,
    row_losses,
    sums_over_client_rows,
    train_and_collect,
)
from mcfl.settings import setting

EVALUATED = ("local", "center")


@dataclasses.dataclass(frozen=True)
class FedSoftParams:
    lam: float = setting(0.1, "lambda: the weight of the proximal pull toward the centers "
                         "(the paper tunes it)", key="fedsoft_lambda", minimum=0)
    interval: int = setting(2, "tau: rounds between two estimates of every client's importance "
                            "weights", key="fedsoft_interval", minimum=1)
    smoother: float = setting(1e-4, "sigma: the floor of an importance weight, so that every "
                              "client counts a little for every center", key="fedsoft_smoother",
                              minimum=0, below=1)
    evaluate: str = setting("local", "the model each client is evaluated with: local (its "
                            "local model, the paper's personalised one) or center (the center "
                            "of its largest u_ks)", key="fedsoft_evaluate", choices=EVALUATED)


class FedSoftShared(flax.struct.PyTreeNode):
    """The server's side: centers [K, ...], every client's importance weights u [C, K], which
    clients have a local model yet [C], the round count (for the estimation interval), and
    whether clients are evaluated with their center."""

    centers: PyTree
    weights: jax.Array
    trained: jax.Array
    round: jax.Array
    evaluate_center: jax.Array  # fedsoft_evaluate == "center"


def nearest_center_counts(apply_fn: ApplyFn, data: FederatedData, centers: PyTree,
                          clients: jax.Array, chunk: int = CLIENT_ROWS_CHUNK,
                          block_size: Optional[int] = None) -> jax.Array:
    """[S, K] how many of each client's training rows each center has the lowest loss on."""
    num_centers = jax.tree.leaves(centers)[0].shape[0]

    def per_chunk(x, y, mask, inp):
        del inp
        nearest = jax.nn.one_hot(jnp.argmin(row_losses(apply_fn, centers, x, y), axis=0),
                                 num_centers)  # [B, K]
        return jnp.sum(nearest * mask[:, None], axis=0)

    return sums_over_client_rows(data, clients, centers, per_chunk,
                                 jnp.zeros((num_centers,), jnp.float32), chunk=chunk,
                                 block_size=block_size)


def importance_weights(counts: jax.Array, smoother) -> jax.Array:
    """[C, K] u_ks = max(n_ks / n_k, sigma), renormalised to sum 1 (uniform for a client
    without rows)."""
    rows = jnp.sum(counts, axis=1, keepdims=True)
    share = jnp.where(rows > 0, counts / jnp.maximum(rows, 1), 1.0 / counts.shape[1])
    floored = jnp.maximum(share, smoother)
    return floored / jnp.sum(floored, axis=1, keepdims=True)


def soft_centers(centers: PyTree, weights: jax.Array) -> PyTree:
    """[b, ...] c_bar_k = sum_s u_ks c_s for each of `weights` [b, K]."""
    return jax.tree.map(lambda c: jnp.tensordot(weights, c, axes=1), centers)


@register("fedsoft", FedSoftParams, reference="Ruan and Joe-Wong, 2022, FedSoft", clustered=True,
          summary="every tau rounds each client's importance weights u_ks (share of its rows "
          "each center fits best); sampled clients train their local model with the proximal "
          "pull (lambda/2) sum_s u_ks ‖w − c_s‖²; centers: u_ks n_k-weighted means; evaluated "
          "with the local model")
def fedsoft(context: AlgorithmContext) -> FederatedAlgorithm:
    """FedSoft with K = ``context.num_clusters`` centers; a client's row is its local model.
    A client keeps its trained local model; what it sends is that model's update (through the
    run's transform), which the centers average with the weights u_ks n_k: collected messages,
    so the round is written here. (The importance estimate's counts, sent every tau rounds by
    every client, are statistics, not model updates: they go through no transform.)"""
    model = context.model
    num_centers = context.num_clusters

    def init(data, key, hp):
        centers = jax.vmap(model.init)(jax.random.split(key, num_centers))
        size = data.num_clients
        return FedSoftShared(centers, jnp.full((size, num_centers), 1.0 / num_centers),
                             jnp.zeros((size,), bool), jnp.zeros((), jnp.int32),
                             jnp.asarray(hp.params.evaluate == "center"))

    def fresh(shared, clients):
        return jax.tree.map(lambda c: jnp.zeros((clients.shape[0],) + c.shape[1:], c.dtype),
                            shared.centers)

    def estimate(shared, data, hp):
        everyone = jnp.arange(data.num_clients, dtype=jnp.int32)
        counts = nearest_center_counts(model.apply, data, shared.centers, everyone,
                                       block_size=context.block_size)
        return importance_weights(counts, hp.params.smoother)

    def own_models(shared, rows, clients):
        """Each client's local model, or c_bar_k before it first trains."""
        trained = shared.trained[clients].astype(jnp.float32)
        return mixture(rows, soft_centers(shared.centers, shared.weights[clients]), trained)

    def evaluated(shared, rows, clients):
        nearest = jnp.argmax(shared.weights[clients], axis=1)
        center = jax.tree.map(lambda c: c[nearest], shared.centers)
        use_center = jnp.broadcast_to(shared.evaluate_center, clients.shape).astype(jnp.float32)
        return mixture(center, own_models(shared, rows, clients), use_center)

    def round_(shared, data, key, hp, exchange):
        clients, rows = exchange.clients, exchange.rows
        train_key = training_key(key)
        due = shared.round % hp.params.interval == 0
        weights = occasional_cond(due, lambda: estimate(shared, data, hp), lambda: shared.weights)
        shared = shared.replace(weights=weights)
        size = clients.shape[0]
        u = weights[clients]
        # rows 0..S-1: the clients' starts; S..2S-1: their anchors c_bar_k
        models = jax.tree.map(lambda a, b: jnp.concatenate([a, b]),
                              own_models(shared, rows, clients),
                              soft_centers(shared.centers, u))
        index = jnp.arange(size, dtype=jnp.int32)
        trained, stats, exchange = train_and_collect(
            Start(models, RoundClients(clients, index, anchor_index=size + index),
                  training=hp.training.replace(mu=hp.params.lam)),
            data, train_key, exchange=exchange, sent=None, block_size=context.block_size)
        starts = jax.tree.map(lambda m: m[:size], models)
        counts = data.train_counts[clients].astype(jnp.float32)
        share = u * counts[:, None]  # [S, K] the paper's aggregation weights, unnormalised
        averaged, total, exchange = columns_mean_of(as_messages(exchange, trained, starts),
                                                    share, 1e-30, exchange)
        centers = jax.tree.map(
            lambda new, old: jnp.where(
                (total > 0).reshape((-1,) + (1,) * (old.ndim - 1)), new, old),
            averaged, shared.centers)
        cluster_of = jnp.argmax(weights, axis=1)
        metrics = training_metrics(counts, stats)
        metrics["models_down"] = (metrics["models_down"] * num_centers
                                  + jnp.where(due, data.num_clients * num_centers, 0))
        metrics["weight_max_mean"] = jnp.mean(jnp.max(weights, axis=1))
        metrics["num_clusters"] = cluster_count(
            jnp.zeros((num_centers,), jnp.int32).at[cluster_of].add(1))
        new_shared = shared.replace(centers=centers, trained=shared.trained.at[clients].max(
                                        exchange.reporting() > 0),
                                    round=shared.round + 1)
        return new_shared, metrics, exchange.replace(rows=trained)

    def cluster_of(shared):
        return jnp.argmax(shared.weights, axis=1).astype(jnp.int32)

    def client_models(shared, data):
        del data  # the embedding trains each client from its center
        return RowModels(train_from=(shared.centers, cluster_of(shared)),
                         newcomers=(shared.centers, None))

    return FederatedAlgorithm(init, sampled(context.clients_per_round), round_, client_models,
                              cluster_of, ClientState(fresh, evaluated, context.store_dtype))
