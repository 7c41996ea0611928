"""DP-FeSEM: FeSEM (Xie et al., "Multi-Center Federated Learning", Eq. 6-10) whose clustering
is itself differentially private at the client level.

FeSEM's server reads every client's trained model twice: to initialise the centers (k-means on
all local models) and in each E-step (Eq. 9, each client to its nearest center). Both steps
move to where DP allows them:

* **E-step on the client.** The server broadcasts the K centers (as IFCA broadcasts its K
  models); each sampled client trains from the center it belongs to (with Eq. 8's proximal
  term), picks the center nearest its trained model (Eq. 9) itself, and sends its update
  relative to *that* center, clipped to C, into that center's noised sum (the M-step, Eq. 10,
  with DP-FedAvg's Gaussian mechanism: `mcfl.privacy.mechanism`, per-cluster counts noised).
  Which center a client joined reaches the server only through those noised sums and counts.
* **A private initialisation: DP Lloyd's k-means** (the SuLQ k-means of Blum, Dwork, McSherry
  and Nissim, PODS 2005, "Practical Privacy: the SuLQ Framework"; Su et al., 2016,
  "Differentially Private k-Means Clustering", on client sketches). Every client trains once
  from the common W_0 (FeSEM's Sec. 6.1), projects its update onto `sketch` dimensions with a
  public Gaussian matrix (a Johnson-Lindenstrauss sketch, so that the noise grows with
  sqrt(sketch), not with the model's size), and clips the sketch to C. From K
  data-independent starting centers, each of `kmeans_iters` iterations has every client join
  its nearest center (on the client) and releases each center's noised sum of sketches and
  noised count (noise multiplier `init_noise`); the last assignment is each client's first
  cluster, and each center's model is W_0 plus the noised mean of its clients' clipped updates.
  These 2 T + 2 Gaussian queries on all clients are accounted as one Gaussian mechanism with
  multiplier ``init_noise / sqrt(2 T + 2)`` composed before the rounds
  (`initial_noise_released`).

Without ``--dp-clip`` the same algorithm runs without clipping or noise.

Defaults: FeSEM's lambda 0.05; the private initialisation's noise multiplier 4.0, 3 Lloyd
iterations and a 32-dimensional sketch are mcfl's choices (no paper sets them: the SuLQ k-means
of Blum et al., 2005, leaves them to the analyst); the run's ``--dp-*`` flags set the rest.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from mcfl.algorithms.clustered.fesem import nearest_models, prox_scale
from mcfl.algorithms.clustered.shared import (
    ClusterState,
    cluster_server,
    clustered_algorithm,
)
from mcfl.algorithms.framework.base import FederatedAlgorithm, stack
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import Start, round_of
from mcfl.engine import RoundClients, train_and_aggregate, train_and_collect
from mcfl.privacy.mechanism import clip_tree
from mcfl.settings import setting

# Without DP the clipping norm is infinite and the noise 0 (the plain algorithm).
NO_CLIP = float("inf")


@dataclasses.dataclass(frozen=True)
class DPFeSEMParams:
    lam: float = setting(0.05, "lambda of FeSEM's Eq. 6: clients train with the proximal "
                         "weight 2 lambda n_bar / n_i (Eq. 8)", key="fesem_lambda", minimum=0)
    init_noise: float = setting(4.0, "noise multiplier of the private k-means initialisation "
                                "(each noised sum and count; 0 without --dp-clip)",
                                key="dp_fesem_init_noise", minimum=0)
    kmeans_iters: int = setting(3, "Lloyd iterations of the private k-means initialisation",
                                key="dp_fesem_kmeans_iters", minimum=1)
    sketch: int = setting(32, "dimensions of the clients' update sketches the initialisation "
                          "clusters", key="dp_fesem_sketch", minimum=1)

    def unused(self, run) -> dict[str, str]:
        """Without --dp-clip the initialisation adds no noise."""
        if run.private:
            return {}
        return {"dp_fesem_init_noise": "is the private initialisation's noise; without "
                                       "--dp-clip dp_fesem runs without clipping or noise"}

    def private_initialisation(self) -> float:
        """The noise multiplier the accountant composes before the rounds
        (`initial_noise_released`; `mcfl.privacy.plan`)."""
        return initial_noise_released(self)


def initial_noise_released(params: DPFeSEMParams) -> float:
    """The multiplier of the one Gaussian mechanism the initialisation amounts to: 2 T + 2
    queries (T sums of sketches and counts, the centers' model sums and counts), each with
    `init_noise`, composed (`mcfl.privacy.accounting.effective_noise`)."""
    if params.init_noise == 0:
        return 0.0
    return params.init_noise / math.sqrt(2 * params.kmeans_iters + 2)


def clip_rows(points: jax.Array, clip) -> jax.Array:
    """[n, f] each row scaled to L2 norm at most `clip`."""
    norms = jnp.linalg.norm(points, axis=1, keepdims=True)
    return points * jnp.minimum(1.0, clip / jnp.maximum(norms, 1e-30))


def noised_means(sums: jax.Array, counts: jax.Array, previous: jax.Array, std, count_std,
                 key) -> jax.Array:
    """[K, f] each center's noised mean: (sum + N(0, std^2)) / (count + N(0, count_std^2));
    a center whose noised count is below 1 keeps `previous`."""
    sum_key, count_key = jax.random.split(key)
    noisy_sums = sums + std * jax.random.normal(sum_key, sums.shape)
    noisy_counts = counts + count_std * jax.random.normal(count_key, counts.shape)
    heard = (noisy_counts >= 1.0)[:, None]
    return jnp.where(heard, noisy_sums / jnp.maximum(noisy_counts, 1.0)[:, None], previous)


def sum_noise_std(noise, clip):
    """The noise std on a sum of rows clipped to `clip`: z C (0 without clipping, no DP)."""
    return noise * jnp.where(jnp.isfinite(clip), clip, 0.0)


def private_kmeans(key: jax.Array, points: jax.Array, num_clusters: int, iterations: int,
                   clip, noise) -> tuple[jax.Array, jax.Array]:
    """DP Lloyd's k-means (module docstring) on clipped `points` [n, f]: ``(labels [n],
    centers [K, f])``; centers start as K random directions of norm clip / 2 (no data
    read)."""
    start_key, key = jax.random.split(key)
    directions = jax.random.normal(start_key, (num_clusters, points.shape[1]))
    centers = clip_rows(directions, 1.0) * 0.5 * jnp.where(jnp.isfinite(clip), clip, 1.0)
    for step in range(iterations):
        labels = nearest(points, centers)
        one_hot = jax.nn.one_hot(labels, num_clusters, dtype=jnp.float32)
        centers = noised_means(one_hot.T @ points, one_hot.sum(0), centers,
                               sum_noise_std(noise, clip), noise,
                               jax.random.fold_in(key, step))
    return nearest(points, centers), centers


def nearest(points: jax.Array, centers: jax.Array) -> jax.Array:
    """[n] the center nearest each point (squared L2)."""
    d = jnp.sum(jnp.square(centers), axis=1)[None, :] - 2.0 * points @ centers.T
    return jnp.argmin(d, axis=1).astype(jnp.int32)


@register("dp_fesem", DPFeSEMParams, clustered=True,
          reference="FeSEM (Xie et al.) with a client-side E-step and DP k-means "
          "initialisation (SuLQ, Blum et al. 2005)",
          summary="FeSEM whose clustering is private: clients pick their nearest center "
          "themselves and send clipped updates into its noised sum; centers initialised by "
          "DP Lloyd's k-means on clipped update sketches")
def dp_fesem(context: AlgorithmContext) -> FederatedAlgorithm:
    """DP-FeSEM with K = ``context.num_clusters`` centers (module docstring)."""
    model = context.model
    num_clusters = context.num_clusters

    def dp_numbers(hp):
        """(C, noise multiplier of the initialisation): the run's clip, or none without DP."""
        if hp.privacy is None:
            return jnp.float32(NO_CLIP), 0.0
        return jnp.asarray(hp.privacy.clip, jnp.float32), hp.params.init_noise

    def init(data, key, hp):
        init_key, train_key, sketch_key, kmeans_key, model_key = jax.random.split(key, 5)
        w0 = model.init(init_key)
        flat0, unravel = ravel_pytree(w0)
        clip, noise = dp_numbers(hp)
        projection = jax.random.normal(sketch_key, (flat0.shape[0], hp.params.sketch)) \
            / math.sqrt(hp.params.sketch)
        clients = jnp.arange(data.num_clients, dtype=jnp.int32)
        plain = hp.training.replace(mu=None)
        selection = RoundClients(clients, jnp.zeros_like(clients))

        def sketch(block):  # [b, sketch] each client's clipped sketch of its update
            flat = jax.vmap(lambda m: ravel_pytree(m)[0])(block) - flat0[None]
            return clip_rows(flat @ projection, clip)

        sketches, _, _ = train_and_collect(
            Start(stack(w0), selection, training=plain),
            data, train_key, features=sketch, block_size=context.block_size)
        labels, _ = private_kmeans(kmeans_key, sketches, num_clusters,
                                   hp.params.kmeans_iters, clip, noise)
        # the centers' models: W_0 plus each cluster's noised mean clipped update (the same
        # training again, its models summed per cluster block by block, never all held)
        def clipped_from_w0(block, segment):
            del segment
            update = jax.tree.map(lambda m, w: m - w[None], block, w0)
            clipped = jax.vmap(lambda u: clip_tree(u, clip, False))(update)
            return jax.tree.map(lambda u, w: u + w[None], clipped, w0)

        sums, counts, _, _, _ = train_and_aggregate(
            Start(stack(w0), selection, jnp.ones(clients.shape), labels, num_clusters,
                  training=plain, align=clipped_from_w0),
            data, train_key, block_size=context.block_size)
        update_sums = jax.vmap(lambda m: ravel_pytree(m)[0])(sums) - counts[:, None] * flat0
        means = noised_means(update_sums, counts, jnp.zeros((num_clusters, flat0.shape[0])),
                             sum_noise_std(noise, clip), noise,
                             model_key)
        centers = jax.vmap(unravel)(flat0[None] + means)
        return ClusterState.create(centers, labels, jnp.ones((num_clusters,), bool))

    def start(state, data, clients, hp):
        begin = state.assignment[clients]
        center_flat = jax.vmap(lambda m: ravel_pytree(m)[0])(state.models)
        clip, _ = dp_numbers(hp)

        def e_step(trained_block):  # on the client: its nearest center (Eq. 9)
            flat = jax.vmap(lambda m: ravel_pytree(m)[0])(trained_block)
            return nearest_models(flat, center_flat)

        def relative_to_joined(trained_block, segment):
            """Each model as the center it joined plus its update from that center, clipped
            to C (the update the client sends: what the noised sum may read)."""
            joined = jax.tree.map(lambda m: m[segment], state.models)
            update = jax.tree.map(jnp.subtract, trained_block, joined)
            clipped = jax.vmap(lambda u: clip_tree(u, clip, False))(update)
            return jax.tree.map(jnp.add, joined, clipped)

        return Start(state.models, RoundClients(clients, begin),
                     jnp.ones(clients.shape, jnp.float32), begin, num_clusters,
                     hp.training.replace(mu=2.0 * hp.params.lam), prox_scale(data, clients),
                     e_step, relative_to_joined, reference=state.models)

    def server(state, summed, data, hp):
        return cluster_server(state, summed, data, hp, num_clusters)

    return clustered_algorithm(context, init, round_of(context, start, server))
