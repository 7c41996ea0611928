"""FeSEM: federated stochastic EM for multi-center FL (Xie et al., "Multi-Center Federated
Learning", papers 000 / 002 / 003, Eq. 6-10, Algorithms 1-2).

Each round, streamed over client blocks (no per-client model is kept between rounds):
  local update (Alg. 2): every sampled client starts from its center W~_{r_i} and trains on
      L_i + (lambda n_bar / n_i) ||W_i - W~_{r_i}||^2, Eq. 8 divided by its weight n_i / N;
  E-step (Eq. 9): r_i = argmin_k ||W_i - W~_k||^2 against the current centers;
  M-step (Eq. 10): W~_k = mean of the sampled W_i assigned to k (unweighted as in the paper,
      or weighted by n_i); a center with no sampled member keeps its value.
This is Algorithm 1's loop (E, M, local update) entered at the local update, so with every
client sampled each round it is the same iteration. Initialisation (paper Sec. 6.1): every
client trains once from a common W_0, then k-means with 20 restarts on those local models,
keeping the restart with the smallest intra-cluster distance; centers are the members' means.

Defaults: the paper's initialisation (20 k-means restarts, Sec. 6.1), E-step distances over
every layer (Eq. 9; the authors' code uses the last dense kernel: ``last_layer``) and the
unweighted M-step (Eq. 10); lambda = 0.05 is mcfl's, the paper gives no value. Local training is
the run's (the paper's N = 1 local update is ``--local-epochs 1``). Measured on planted data no
test tunes on (REPRODUCTION.md, "Defaults against each paper's setting"): ARI 92.6 (P(X|Y)) and
100 (P(Y|X)) with the defaults.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from mcfl.algorithms.clustered.shared import (
    EVALUATIONS,
    ClusterState,
    cluster_means,
    cluster_server,
    clustered_algorithm,
    features_fn,
    record_received,
    stacked_features,
    unravel_rows,
)
from mcfl.algorithms.framework.base import FederatedAlgorithm, PopulationStart, stack
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import Start, round_of
from mcfl.algorithms.framework.stored import at_storage_precision
from mcfl.clustering import kmeans
from mcfl.clustering.streamed import cluster_means_streamed, kmeans_streamed
from mcfl.engine import (
    PyTree,
    RoundClients,
    segment_mean,
    train_and_aggregate,
    train_and_collect,
)
from mcfl.settings import setting


def tree_dots(block: PyTree, models: PyTree) -> jax.Array:
    """[b, K] inner products <W_i, M_k> of a block of trees [b, ...] with models [K, ...]."""
    return sum(
        jnp.tensordot(
            w.reshape(w.shape[0], -1), m.reshape(m.shape[0], -1).T, axes=1,
            precision=jax.lax.Precision.HIGHEST,
        )
        for w, m in zip(jax.tree.leaves(block), jax.tree.leaves(models))
    )


def tree_sq_norms(tree: PyTree) -> jax.Array:
    """[n] squared norms of a stacked tree [n, ...]."""
    return sum(jnp.sum(jnp.square(x.reshape(x.shape[0], -1)), axis=1)
               for x in jax.tree.leaves(tree))


def nearest_models(block: PyTree, models: PyTree) -> jax.Array:
    """[b] index of the model nearest each tree in squared L2 (FeSEM's E-step, Eq. 9), without
    forming [b, K, d]: ||W||^2 - 2 <W, M> + ||M||^2."""
    d = tree_sq_norms(models)[None, :] - 2.0 * tree_dots(block, models)
    return jnp.argmin(d, axis=1).astype(jnp.int32)  # ||W||^2 is the same for every k


@dataclasses.dataclass(frozen=True)
class FeSEMParams:
    lam: float = setting(0.05, "lambda of Eq. 6: clients train with the proximal weight "
                         "2 lambda n_bar / n_i (Eq. 8)", key="fesem_lambda", minimum=0)
    restarts: int = setting(20, "k-means restarts of the initialisation (paper Sec. 6.1)",
                            key="fesem_restarts", minimum=1)
    last_layer: bool = setting(False, "cluster on the last dense kernel only (the authors' "
                               "code)", key="fesem_last_layer")
    weighted: bool = setting(False, "M-step weighted by n_i instead of Eq. 10's plain mean",
                             key="fesem_weighted")
    evaluate_with: str = setting("current", "the model a client is evaluated with: current "
                                 "(its center now) | last_received (the one it started its "
                                 "last round from: the FlexCFL authors' code; a model per "
                                 "client)", choices=EVALUATIONS)


def prox_scale(data, clients: jax.Array) -> jax.Array:
    """[S] each sampled client's proximal scale n_bar / n_i: Eq. 8's distance term over the
    client's weight n_i / N in the objective, relative to a client of average size."""
    counts = data.train_counts.astype(jnp.float32)
    return jnp.mean(counts) / counts[clients]


@register("fesem", FeSEMParams, clustered=True,
          reference="Xie et al., 2020 / 2023, Multi-Center FL (FeSEM)",
          summary="sampled clients train from their center with Eq. 8's proximal term; E-step: "
          "each joins its nearest center (Eq. 9); M-step: centers become their members' mean "
          "(Eq. 10); initialised by k-means with restarts on one round of local models")
def fesem(context: AlgorithmContext, align_to_centers=None) -> FederatedAlgorithm:
    """FeSEM with K = ``context.num_clusters`` centers and distance weight lambda
    (``hp.params.lam``).

    The default lambda = 0.05 gives a proximal weight mu = 2 lambda = 0.1 for a client of
    average size, the FedProx mu used in the FeSEM paper's baselines. With
    `align_to_centers(block, centers)`, each block of trained models is aligned to the centers
    its clients joined before the M-step averages them (FeSEM-MA). The round is the skeleton's
    (`mcfl.algorithms.framework.skeleton`): the E-step picks each message's segment after training.
    """
    model = context.model
    num_clusters = context.num_clusters

    def m_step_weights(data, clients, params):
        if params.weighted:
            return data.train_counts[clients]
        return jnp.ones(clients.shape, jnp.int32)

    def start_points(data, key, hp, clients):
        """[b, f] features of `clients` trained once from W_0 (no proximal term): flattened
        models, or their last dense kernels. Only features are collected, never the stacked
        models besides: 500 FashionMNIST CNNs are 6.5 GB."""
        init_key, train_key, _ = jax.random.split(key, 3)
        w0 = model.init(init_key)
        selection = RoundClients(clients, jnp.zeros_like(clients))
        plain = hp.training.replace(mu=None)
        points, _, _ = train_and_collect(
            Start(stack(w0), selection, training=plain),
            data, train_key,
            features=lambda block: stacked_features(block, hp.params.last_layer),
            block_size=context.block_size)
        return points

    def start_state(data, key, hp, labels, means):
        """The state from the start's labels; the centers are the members' means (`means`
        [K, f] of the points, or for last-layer features a second pass of the same training,
        aggregated as it goes)."""
        init_key, train_key, _ = jax.random.split(key, 3)
        w0 = model.init(init_key)
        if hp.params.last_layer:
            clients = jnp.arange(data.num_clients, dtype=jnp.int32)
            selection = RoundClients(clients, jnp.zeros_like(clients))
            sums, weight_sums, _, _, _ = train_and_aggregate(
                Start(stack(w0), selection, m_step_weights(data, clients, hp.params), labels,
                      num_clusters, training=hp.training.replace(mu=None)),
                data, train_key, block_size=context.block_size)
            centers = segment_mean(sums, weight_sums, stack(w0, num_clusters))
        else:
            centers = unravel_rows(means, w0)
        return ClusterState.create(centers, labels, jnp.ones((num_clusters,), bool),
                                   hp.params.evaluate_with)

    def init(data, key, hp):
        kmeans_key = jax.random.split(key, 3)[2]
        clients = jnp.arange(data.num_clients, dtype=jnp.int32)
        points = at_storage_precision(start_points(data, key, hp, clients),
                                      context.store_dtype)
        labels = kmeans(kmeans_key, points, num_clusters,
                        restarts=hp.params.restarts).labels.astype(jnp.int32)
        means = cluster_means(points, labels, num_clusters,
                              m_step_weights(data, clients, hp.params))
        return start_state(data, key, hp, labels, means)

    def finish(data, key, hp, source):
        """`init` with the points read from `source` in chunks (a client store)."""
        kmeans_key = jax.random.split(key, 3)[2]
        labels = np.asarray(kmeans_streamed(kmeans_key, source, num_clusters,
                                            restarts=hp.params.restarts).labels, np.int32)
        means = None
        if not hp.params.last_layer:
            weights = m_step_weights(data, jnp.arange(data.num_clients, dtype=jnp.int32),
                                     hp.params)
            means = jnp.asarray(cluster_means_streamed(source, labels, num_clusters,
                                                       np.asarray(weights)), jnp.float32)
        return jax.jit(start_state)(data, key, hp, jnp.asarray(labels), means)

    def start(state, data, clients, hp):
        begin = state.assignment[clients]
        features = features_fn(hp.params.last_layer)
        center_features = jax.vmap(features)(state.models)

        def e_step(trained_block):
            return nearest_models(jax.vmap(features)(trained_block), center_features)

        align = None
        if align_to_centers is not None:
            def align(trained_block, segment):
                joined = jax.tree.map(lambda m: m[segment], state.models)
                return align_to_centers(trained_block, joined)

        return Start(state.models, RoundClients(clients, begin),
                     m_step_weights(data, clients, hp.params), begin, num_clusters,
                     hp.training.replace(mu=2.0 * hp.params.lam), prox_scale(data, clients),
                     e_step, align)

    def server(state, summed, data, hp):
        received = record_received(state, summed.clients, summed.starts)
        return cluster_server(received, summed, data, hp, num_clusters)

    return clustered_algorithm(context, init, round_of(context, start, server),
                               PopulationStart(start_points, finish))
