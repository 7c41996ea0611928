"""CFL-GP (Kim, Kim and de Veciana, ICML 2024, "Clustered Federated Learning via Gradient-based
Partitioning", Algorithm 1; the authors' code Heasung-Kim/clustered-federated-learning-via-
gradient-based-partitioning, central_unit.py `run_CFLGP`, and their blog post).

Clients of one distribution send similar gradients *for the same model*. The server keeps K
models and, per client, a running mean of the gradients the client returned for each model:
the gradient profile G, K blocks of d rows, one column per client. Every P rounds
(`cflgp_period`) while the round is below T_cl (`cflgp_stop`):

1. the criterion model k* (round robin over the K models, k*_t = floor(t / P) mod K) goes to
   the round's clients, each returns one minibatch gradient at theta_{k*} (a batch drawn apart
   from the one of its own gradient below: the code draws a fresh batch per call), and its
   column of block k* becomes the running mean of its visits (beta = 1/n at its n-th visit);
2. G is projected on its top K left singular vectors (uncentred; Z = S_K V_K^T) and the
   clients' K-dim features are clustered by k-means (k-means++ seeding, `cflgp_restarts`
   restarts, the lowest inertia kept);
3. the new labels are permuted to agree best with the old ones (Hungarian assignment on the
   K x K agreement counts, in JAX: optax's; the code tries all K! permutations).

Every round, each client returns one minibatch gradient (batch of --batch-size rows, the
engine's batch rule) of its cluster's model, and each cluster takes one server SGD step of
size `server_lr` (the paper's gamma, 0.1) on its members' unweighted mean gradient; a cluster
no member reported to keeps its model. The K models start from K independent random
initialisations; before the first clustering every client is in cluster 0. Besides the usual
metrics a round reports `reclustered` (1 or 0), `criterion` (k*, -1 in other rounds) and
`moved` (clients whose cluster changed); `models_down` / `models_up` count the criterion
model and its gradient too.

The gradient protocol is the default, as in the paper: a round is one gradient per client
(two on clustering rounds), so a run of R rounds takes R server steps, where mcfl's other
algorithms take E epochs of local steps a round; it passes the conformance checks as FedSGD
does (``local_steps`` 1, ``discrepancy`` 0).

Protocols (`cflgp_protocol`): ``gradient`` (the paper's default, above: --lr and --local-*
are unused) or ``model_averaging`` (the code's other protocol, mcfl's usual round: clients
train locally with the run's --lr / --local-*; the profile averages model updates dW taken
from theta_{k*}, and each cluster takes its members' plain mean model, as the code's
model averaging does; `server_lr` is then unused).

Code against paper (the research note's discrepancies), and what mcfl does:

* criterion (`cflgp_criterion`): ``round_robin`` is the paper and blog (default). ``fixed0``
  reproduces the released code: k* = 0, never advanced (L159), so blocks 1..K-1 of G stay 0;
  the column it stores is the gradient each client returned for *its own* cluster's model
  (L199-204 index the model by the client's label), with the code's
  beta_t = 1 / (floor((t + 1) / (K P)) + 1) (L229) in place of the per-visit 1/n; and the
  clusters' models are stepped by those gradients under the new labels (L277-296).
* order within a clustering round: in the paper version the criterion gradients come first,
  then the re-clustering, then each client's gradient at its *new* cluster's model, so every
  model is stepped by gradients taken at it (with ``fixed0`` a client that moves steps its new
  cluster's model with a gradient taken at its old one, as the code does).
* beta: the running mean counts each client's own visits of each block (the code's formula
  halves the first sample of the last block with P = 1, and with partial participation a
  block's visits differ per client).
* G accumulates only while re-clustering goes on (the code keeps filling it after T_cl, for
  nothing that reads it).

Partial participation (mcfl's runs sample --clients-per-round; the paper queries everyone):
only the round's reporting clients update their columns. A column a client never filled
stands, for the clustering, at the mean of the block's filled columns (with every client
reporting, as in the paper, this changes nothing). Left at 0, as the code initialises G, an
unfilled column would put its client far from every filled one and cluster clients by who was
sampled when (digits rotated by 0/90/180/270 degrees, 40 clients, 20 a round, batch 50, two
seeds: ARI 0.39 and 0.66 after 30 rounds at 0, 0.64 and 0.75 at the mean). A client that has
filled none yet keeps its label (cluster 0 until profiled): with few clients a round and a
short T_cl some clients are never profiled, and stay where they are.

The projection is on K uncentred components, as the code's: each filled block's mean gradient
can take a direction of its own, leaving fewer of the K for the differences between clusters
as blocks fill (the digits above with every client and full batches, seed 0: ARI 1.0 after the
first clustering, 0.93 once block 3 was filled); the code's choice is kept.

State: G is kept whole, [K, C, d] float32 (K d C floats: 326 MB for the paper's 128 clients of
a 784-200-10 MLP, K = 4), with each block's uncentred Gram matrix G_k G_k^T [K, C, C]: the
running-mean update of a column needs the column itself and the Gram rows of the updated
columns need every column of the block (an inner product with each), so G cannot be dropped
for the Gram; keeping the Grams, a clustering round recomputes only its S updated rows
(S C d) instead of K C^2 d, and the SVD of G is an eigendecomposition of the summed C x C
Gram (`mcfl.clustering.svd.left_singular_from_gram`). G is the server's, not the clients':
it is held with the algorithm's state on the device, not in a client store.

Not implemented: the code's unknown-K mode (warm-up, eigen-gap rank and silhouette search,
off by default there) and its optional gradient compression. Models with batch statistics are
refused (gradients would train them as parameters), as FedSGD refuses them.

Defaults: the paper's gradient protocol (one minibatch gradient a round, gamma 0.1) and
round-robin criterion models; the code's P = 2 and T_cl = 10. One gradient a round trains
slowly: after 30 rounds 56.1 / 25.5 accuracy against 74.6 / 35.0 with ``protocol
model_averaging`` (P(X|Y) / P(Y|X); REPRODUCTION.md, "Defaults against each paper's setting");
compare CFL-GP with the others at equal local work through that protocol.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from mcfl.algorithms.clustered.shared import (
    ClusterState,
    cluster_count,
    cluster_sizes,
    clustered_algorithm,
    flat_models,
    unravel_rows,
)
from mcfl.algorithms.framework.base import FederatedAlgorithm, training_key, training_metrics
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import server_sums, transformed
from mcfl.clustering import kmeans
from mcfl.clustering.distances import HIGHEST
from mcfl.clustering.svd import left_singular_from_gram
from mcfl.data.federated import FederatedData
from mcfl.engine import (
    UPDATES,
    ApplyFn,
    PyTree,
    RoundClients,
    Start,
    block_size_for,
    map_blocks,
    masked_cross_entropy,
    occasional_cond,
    segment_sums,
    train_and_collect,
)
from mcfl.engine.batch_rule import step_rows
from mcfl.errors import ConfigError
from mcfl.settings import setting

PROTOCOLS = ("gradient", "model_averaging")
# round_robin: the paper's k* = floor(t / P) mod K, gradients at theta_{k*}; fixed0: the released
# code (k* = 0, the client's own-model gradient, the code's beta formula, new-label update)
CRITERIA = ("round_robin", "fixed0")


# The shared settings of local training, which a round of one gradient per client leaves
# unused (`CFLGPParams.unused`, `fedsgd`'s).
LOCAL_TRAINING = ("lr", "local_epochs", "local_steps", "client_optimizer", "weight_decay")


@dataclasses.dataclass(frozen=True)
class CFLGPParams:
    protocol: str = setting("gradient", "what a client returns: gradient (one minibatch "
                            "gradient of --batch-size rows, the paper's) | model_averaging "
                            "(local training with --lr, --local-*: the profile averages model "
                            "updates, clusters take their members' mean model)",
                            key="cflgp_protocol", choices=PROTOCOLS)
    server_lr: float = setting(0.1, "gradient protocol: the server's SGD step on a cluster's "
                               "mean gradient (the paper's gamma, 0.1)", above=0)
    period: int = setting(2, "P: the gradient profile is updated and the clients re-clustered "
                          "every P rounds", key="cflgp_period", minimum=1)
    stop: int = setting(10, "T_cl: re-clustering (and profiling) stops from this round on",
                        key="cflgp_stop", minimum=1)
    criterion: str = setting("round_robin", "the model whose gradients fill the profile: "
                             "round_robin (k* = (t/P) mod K, the paper) | fixed0 (the released "
                             "code: block 0 only, filled with each client's gradient of its "
                             "own cluster's model)", key="cflgp_criterion", choices=CRITERIA)
    restarts: int = setting(10, "k-means restarts (k-means++ seeding) of each clustering",
                            key="cflgp_restarts", minimum=1)

    def unused(self, run) -> dict[str, str]:
        """Under the gradient protocol a client computes one minibatch gradient (its local
        training's settings go unused, but for the clock's count of its work); under model
        averaging the server takes its members' mean model (no server step)."""
        if self.protocol == "model_averaging":
            return {"server_lr": "is the gradient protocol's server step; --cflgp-protocol "
                                 "model_averaging takes the members' mean model"}
        if run.clock:
            return {}
        why = ("is a setting of local training; --cflgp-protocol gradient sends one minibatch "
               "gradient a round (its server step is --server-lr)")
        return {key: why for key in LOCAL_TRAINING}


class CFLGPState(ClusterState):
    """`ClusterState` plus the gradient profile: `profile` [K, C, d] (block k, client i: the
    running mean of the client's messages for model k), `gram` [K, C, C] (each block's
    uncentred Gram matrix, profile[k] profile[k]^T) and `visits` [K, C] int32 (how many
    messages each column averages)."""

    profile: jax.Array
    gram: jax.Array
    visits: jax.Array


def minibatch_gradients(apply_fn: ApplyFn, data: FederatedData, models: PyTree,
                        selection: RoundClients, key: jax.Array, batch: int,
                        block_size: Optional[int] = None) -> tuple[PyTree, jax.Array]:
    """[S, ...] each selected client's gradient of its mean cross-entropy on one minibatch
    (its first batch under `key`, `mcfl.engine.batch_rule`) at
    ``models[selection.start_index]``, and [S] that loss (CFL-GP's client computation,
    client.py `compute_gradient`)."""
    def one(inp):
        params = jax.tree.map(lambda m: m[inp["start"]], models)
        rows, mask = step_rows(key, data, inp["client"], 0, batch)
        x, y = data.x_train[rows], data.y_train[rows]
        loss, grad = jax.value_and_grad(
            lambda p: masked_cross_entropy(apply_fn(p, x), y, mask))(params)
        return grad, loss

    inputs = {"client": selection.clients, "start": selection.start_index}
    size = block_size_for(models, selection.clients.shape[0], block_size)
    return map_blocks(jax.vmap(one), inputs, size)


def updated_profile(profile: jax.Array, gram: jax.Array, visits: jax.Array, block,
                    clients: jax.Array, messages: jax.Array, present: jax.Array,
                    beta=None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The profile after `clients` [S] sent `messages` [S, d] for model `block` (a traced
    index): each reporting client's column (`present` [S], 1.0 or 0.0) moves to
    ``(1 - b) old + b message`` with b = 1/n at its n-th visit of the block (a running mean),
    or the given `beta`; the block's Gram rows and columns of those clients are recomputed
    from the new columns (S C d). A client listed twice with one slot not reporting (a Poisson
    round's filler) is updated once. Returns (profile, gram, visits)."""
    present = present.astype(profile.dtype)
    counted = present.astype(visits.dtype)
    seen = visits[block, clients] + counted  # [S]
    if beta is None:
        step = present / jnp.maximum(seen, 1).astype(profile.dtype)
    else:
        step = present * beta
    old = profile[block, clients]  # [S, d]
    profile = profile.at[block, clients].add(step[:, None] * (messages - old))
    visits = visits.at[block, clients].add(counted)
    columns = profile[block]  # [C, d]
    rows = jnp.matmul(columns[clients], columns.T, precision=HIGHEST)  # [S, C]
    block_gram = gram[block].at[clients, :].set(rows).at[:, clients].set(rows.T)
    return profile, gram.at[block].set(block_gram), visits


def filled_gram(gram: jax.Array, visits: jax.Array) -> jax.Array:
    """[C, C] the Gram matrix of the whole profile (clients' columns of all K blocks stacked)
    with every column a client never filled standing at the mean of its block's filled ones,
    from the blocks' Grams [K, C, C] alone: an unfilled column is 0, so with m the filled mask,
    n its count, v = Gram m / n and q = m^T Gram m / n^2, the filled block's Gram is
    ``Gram + v u^T + u v^T + q u u^T`` with u = 1 - m. Every column filled (the paper's full
    participation): the plain sum of the Grams."""
    filled = (visits > 0).astype(gram.dtype)  # [K, C]
    count = jnp.maximum(jnp.sum(filled, axis=1), 1.0)  # [K]
    v = jnp.einsum("kij,kj->ki", gram, filled, precision=HIGHEST) / count[:, None]  # [K, C]
    q = jnp.sum(filled * v, axis=1) / count  # [K]
    u = 1.0 - filled
    full = (gram + v[:, :, None] * u[:, None, :] + u[:, :, None] * v[:, None, :]
            + q[:, None, None] * u[:, :, None] * u[:, None, :])
    return jnp.sum(full, axis=0)


def profile_features(gram: jax.Array, k: int) -> jax.Array:
    """[C, k] the clients' coordinates on the top-k left singular vectors of the profile G
    ([K d, C], clients as columns) given its Gram G^T G [C, C]: the columns of
    ``Z = U_k^T G = S_k V_k^T`` (the code's utils.py L21-22), up to signs."""
    u, s = left_singular_from_gram(gram, k)
    return u * s[None, :]


def matched_labels(new: jax.Array, old: jax.Array, weights: jax.Array, k: int) -> jax.Array:
    """[C] `new` labels renamed so that as many clients (counted with `weights` [C]) as
    possible keep their `old` label: the Hungarian assignment on the K x K agreement counts
    (the code tries all K! permutations, utils.py L42-52). optax's, in JAX: scipy's
    (`mcfl.algorithms.clustered.matching`) is a host callback, which keeps a round from lowering for
    TPU and CUDA (`mcfl.planning.lowering`)."""
    agreement = jnp.matmul((jax.nn.one_hot(new, k) * weights[:, None]).T,
                           jax.nn.one_hot(old, k), precision=HIGHEST)  # [new, old]
    rows, cols = optax.assignment.hungarian_algorithm(-agreement)  # new rows[j] -> cols[j]
    rename = jnp.zeros((k,), jnp.int32).at[rows].set(cols.astype(jnp.int32))
    return rename[new]


def reclustered(state: CFLGPState, key: jax.Array, restarts: int) -> CFLGPState:
    """`state` with the clients that have a profile re-clustered: k-means on their
    `profile_features` (the others weigh nothing and keep their label), labels matched to the
    old ones (`matched_labels`)."""
    k = state.visits.shape[0]
    profiled = jnp.any(state.visits > 0, axis=0)  # [C]
    weights = profiled.astype(jnp.float32)
    anyone = jnp.any(profiled)  # (nobody yet: every label stays, and no 0/0 in the seeding)
    features = profile_features(filled_gram(state.gram, state.visits), k)  # [C, K]
    found = kmeans(key, features, k, restarts, weights=jnp.where(anyone, weights, 1.0))
    labels = matched_labels(found.labels, state.assignment, weights, k)
    assignment = jnp.where(profiled, labels, state.assignment)
    return state.replace(assignment=assignment, sizes=cluster_sizes(assignment, k))


@register("cflgp", CFLGPParams, clustered=True,
          reference="Kim, Kim and de Veciana, 2024, CFL-GP",
          summary="each sampled client sends one minibatch gradient of its cluster's model "
          "(cflgp_protocol gradient; or trains locally); every cflgp_period rounds until "
          "cflgp_stop, also of a criterion model (round robin over the K), kept as a running "
          "mean per client (the gradient profile); k-means on the profile's top-K SVD "
          "projection, labels matched to the old ones; each cluster steps by its members' "
          "mean gradient (server_lr)")
def cflgp(context: AlgorithmContext) -> FederatedAlgorithm:
    """CFL-GP with K = ``context.num_clusters`` models (the module docstring)."""
    model = context.model
    num_clusters = context.num_clusters
    if model.collections:
        raise ConfigError(f"cflgp clusters clients by their gradients and steps its models by "
                          f"them, which would train the model's {', '.join(model.collections)} "
                          f"as parameters; use a model without batch norm (GroupNorm, "
                          f"LayerNorm)")

    def init(data, key, hp):
        del hp
        models = jax.vmap(model.init)(jax.random.split(key, num_clusters))
        size = ravel_pytree(jax.tree.map(lambda m: m[0], models))[0].shape[0]
        count = data.num_clients
        base = ClusterState.create(models, jnp.zeros((count,), jnp.int32),
                                   jnp.ones((num_clusters,), bool))
        return CFLGPState(base.models, base.assignment, base.active, base.round, base.sizes,
                          None, jnp.zeros((num_clusters, count, size), jnp.float32),
                          jnp.zeros((num_clusters, count, count), jnp.float32),
                          jnp.zeros((num_clusters, count), jnp.int32))

    def messages(models, data, clients, start, key, hp, exchange):
        """[S, d] what `clients` send from ``models[start]`` (through the exchange's
        transform): a minibatch gradient, or the update of their local training; [S] their
        loss; the training stats (model averaging) or None; the exchange."""
        if hp.params.protocol == "gradient":
            grads, losses = minibatch_gradients(model.apply, data, models,
                                                RoundClients(clients, start), key,
                                                hp.training.batch_size, context.block_size)
            return flat_models(transformed(exchange, grads)), losses, None, exchange
        trained, stats, exchange = train_and_collect(
            Start(models, RoundClients(clients, start), training=hp.training),
            data, key, exchange=exchange, block_size=context.block_size)
        return flat_models(trained) - flat_models(models)[start], stats.loss, stats, exchange

    def round_(state, data, key, hp, exchange):
        params = hp.params
        train_key = training_key(key)  # (the first half chose the participants)
        criterion_key, kmeans_key = (jax.random.fold_in(train_key, 1),
                                     jax.random.fold_in(train_key, 2))
        clients = exchange.clients
        present = exchange.reporting()
        before = state.assignment
        t = state.round
        clustering = (t % params.period == 0) & (t < params.stop)
        released = params.criterion == "fixed0"
        if released:
            criterion = jnp.zeros((), jnp.int32)
            own = state.assignment[clients]
            sent, losses, stats, exchange = messages(state.models, data, clients, own,
                                                     train_key, hp, exchange)
            beta = 1.0 / ((t + 1) // (num_clusters * params.period) + 1).astype(jnp.float32)

            def cluster(s):
                profile, gram, visits = updated_profile(s.profile, s.gram, s.visits, 0,
                                                        clients, sent, present, beta)
                return reclustered(s.replace(profile=profile, gram=gram, visits=visits),
                                   kmeans_key, params.restarts)
        else:
            criterion = ((t // params.period) % num_clusters).astype(jnp.int32)

            def cluster(s):
                start = jnp.full(clients.shape, criterion, jnp.int32)
                found, _, _, _ = messages(s.models, data, clients, start, criterion_key, hp,
                                          exchange)
                profile, gram, visits = updated_profile(s.profile, s.gram, s.visits,
                                                        criterion, clients, found, present)
                return reclustered(s.replace(profile=profile, gram=gram, visits=visits),
                                   kmeans_key, params.restarts)

        state = occasional_cond(clustering, cluster, lambda s: s, state)
        segments = state.assignment[clients]
        if not released:  # gradients at the new clusters' models
            sent, losses, stats, exchange = messages(state.models, data, clients, segments,
                                                     train_key, hp, exchange)
        weights = exchange.weigh(jnp.ones(clients.shape, jnp.float32))
        sums, totals = segment_sums(sent, segments, weights, num_clusters)
        sums, totals, exchange = server_sums(exchange, sums, totals, UPDATES)
        mean = jnp.where(totals[:, None] > 0, sums / jnp.maximum(totals, 1e-30)[:, None], 0.0)
        step = -params.server_lr * mean if params.protocol == "gradient" else mean
        like = jax.tree.map(lambda m: m[0], state.models)
        models = jax.tree.map(jnp.add, state.models, unravel_rows(step, like))

        reporting = jnp.sum(present)
        sizes = data.train_counts[clients].astype(jnp.float32)
        if stats is None:
            w = sizes * present
            metrics = {"train_loss": jnp.sum(w * losses) / jnp.maximum(jnp.sum(w), 1e-30),
                       # clients send gradients and keep no model (FedSGD's convention)
                       "discrepancy": jnp.zeros(()), "local_steps": jnp.ones(())}
        else:
            metrics = training_metrics(sizes, stats)
        # the criterion model and its gradient or update, besides the own ones
        exchanged = reporting * (1.0 + jnp.where(clustering & (not released), 1.0, 0.0))
        metrics.update({
            "models_down": exchanged, "models_up": exchanged,
            "num_clusters": cluster_count(state.sizes),
            "reclustered": clustering.astype(jnp.float32),
            "criterion": jnp.where(clustering, criterion, -1).astype(jnp.float32),
            "moved": jnp.sum(state.assignment != before).astype(jnp.float32),
        })
        return state.replace(models=models, round=t + 1), metrics, exchange

    return clustered_algorithm(context, init, round_)
