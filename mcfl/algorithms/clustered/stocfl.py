"""StoCFL (Zeng, Hu, Liu, Yu, Wang and Xu, 2023, "Stochastic Clustered Federated Learning"),
as its authors' code (dunzeng/StoCFL, StoCFL-FCC+CFL) runs it.

Every client starts as a cluster of its own. The first time a client is sampled it computes
its representation psi_i = a - a_i: a is one random model fixed for the whole run (the
anchor), a_i the anchor after `stocfl_observe_epochs` full-batch gradient steps on the
client's data. Each round, every cluster among the sampled clients gets a direction, the mean
psi of its sampled members; clusters whose directions have cosine similarity >= tau are
merged (all such pairs: the connected components of that graph; the merged cluster keeps the
smallest client id and the model of its largest part). Then every sampled client trains

    its cluster's model on f_i(w) + (mu / 2) ||w - w_g||^2   (w_g: the round's global model)
    the global model on f_i(w)

and the server takes plain means: the global model over the sampled clients, each cluster's
model over its sampled members. A cluster trains from the global model until it has a model.

Fixed shapes: cluster models live in K = `--clusters` slots (the most clusters with a model of
their own), given to the round's clusters largest first and freed when clusters merge; a
cluster without a slot trains and is evaluated with the global model (the authors' code gives
every cluster a model; with K at or above the number of groups the slots do not run out once
the groups have merged). Each client is evaluated with its cluster's model; its cluster for the
ARI is its cluster's slot (-1: none). Representations are rows of the run's client store.

Defaults: tau 0.65 (the authors' README command; their script's default is 0.3), mu 0.05 and 10
observation epochs (the authors' code). The two taus measured ARI 4.6 / 4.3 (0.65) and 0.7 /
34.7 (0.3) under P(X|Y) / P(Y|X) with 20 of 240 clients a round for 30 rounds, too few visits a
client for StoCFL's merges (REPRODUCTION.md, "Defaults against each paper's setting").
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.algorithms.clustered.shared import flat_models
from mcfl.algorithms.framework.base import (
    ClientState,
    FederatedAlgorithm,
    RowModels,
    refuse_stateful,
    sampled,
    stack,
    training_key,
    training_metrics,
)
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import aggregate, columns_mean_of, global_start, transformed
from mcfl.clustering.distances import cosine_similarity
from mcfl.engine import (
    CLIENT_ROWS_CHUNK,
    PyTree,
    RoundClients,
    Start,
    block_size_for,
    by_length,
    ceil_div,
    map_clients,
    occasional_cond,
    train_and_collect,
)
from mcfl.engine.client_data import full_gradient
from mcfl.settings import setting


@dataclasses.dataclass(frozen=True)
class StoCFLParams:
    tau: float = setting(0.65, "tau: clusters whose directions have cosine similarity >= tau "
                         "merge (the authors' README command; their script's default: 0.3)",
                         key="stocfl_tau", minimum=-1, maximum=1)
    mu: float = setting(0.05, "mu: the pull (mu/2)||w - w_g||^2 of a cluster's model toward "
                        "the global model in local training", key="stocfl_mu", minimum=0)
    observe_epochs: int = setting(10, "full-batch gradient steps from the anchor that give a "
                                  "client's representation", key="stocfl_observe_epochs",
                                  minimum=1)


class StoCFLShared(flax.struct.PyTreeNode):
    """The global model, the anchor, the K slot models [K, ...] and which slots are in use
    [K]; per client its cluster (the smallest client id in it) [C] and whether it has its
    representation yet [C]; per cluster id its slot (-1: none) [C]."""

    global_model: PyTree
    anchor: PyTree
    slots: PyTree
    used: jax.Array
    cluster_of: jax.Array
    observed: jax.Array
    slot_of: jax.Array


def representations(apply_fn, data, anchor, clients, lr, steps: int, block_size=None):
    """[S, d] psi_i = anchor - (anchor after `steps` full-batch gradient steps at `lr`)."""
    start = flat_models(stack(anchor))[0]

    def one_client(inp, loop_length, alone):
        del alone
        offset, count = data.train_offsets[inp["client"]], data.train_counts[inp["client"]]

        def step(_, params):
            grad, _ = full_gradient(apply_fn, data, params, offset, count, CLIENT_ROWS_CHUNK,
                                    loop_length)
            return jax.tree.map(lambda p, g: p - lr * g, params, grad)

        trained = jax.lax.fori_loop(0, steps, step, anchor)
        return start - flat_models(stack(trained))[0]

    inputs = {"client": clients, "chunks": ceil_div(data.train_counts[clients],
                                                     CLIENT_ROWS_CHUNK)}
    return map_clients(by_length(one_client, "chunks"), inputs, inputs["chunks"],
                       block_size_for(stack(anchor), clients.shape[0], block_size))


def merged_roots(roots: jax.Array, directions: jax.Array, tau) -> jax.Array:
    """[S] each sampled client's cluster after merging: clusters (`roots` [S], with the
    direction of each in `directions` [S, d]) joined when their cosine similarity >= tau,
    transitively; a merged cluster is named by its smallest id."""
    size = roots.shape[0]
    linked = (cosine_similarity(directions) >= tau) | (roots[:, None] == roots[None, :])

    def spread(_, names):  # every position takes the smallest name among its links
        return jnp.min(jnp.where(linked, names[None, :], jnp.iinfo(jnp.int32).max), axis=1)

    return jax.lax.fori_loop(0, size, spread, roots)


@register("stocfl", StoCFLParams, reference="Zeng et al., 2023, StoCFL", clustered=True,
          summary="clients start alone; a sampled client's representation is the anchor "
          "minus the anchor trained on its data; clusters whose mean representations have "
          "cosine >= tau merge; clients train their cluster's model (pulled toward the global "
          "one by mu) and the global model; plain means")
def stocfl(context: AlgorithmContext) -> FederatedAlgorithm:
    """StoCFL with at most K = ``context.num_clusters`` cluster models; a client's row is its
    representation psi [d]. Its round is two trainings (each client's cluster model, then the
    global model) and a merge, written here; a client's messages are its representation (sent
    once), its cluster model's update and its global model's, each through the run's
    transform."""
    model = context.model
    num_slots = context.num_clusters
    refuse_stateful(model, "stocfl")

    def init(data, key, hp):
        del hp
        global_key, anchor_key = jax.random.split(key)
        global_model = model.init(global_key)
        size = data.num_clients
        return StoCFLShared(global_model, model.init(anchor_key), stack(global_model, num_slots),
                            jnp.zeros((num_slots,), bool), jnp.arange(size, dtype=jnp.int32),
                            jnp.zeros((size,), bool), jnp.full((size,), -1, jnp.int32))

    def fresh(shared, clients):
        d = flat_models(stack(shared.anchor)).shape[1]
        return jnp.zeros(clients.shape + (d,), jnp.float32)

    def assign_slots(shared, old_roots, new_roots, part_sizes, merged_sizes):
        """Slots after the merge: a merged cluster keeps the slot of its largest part that
        had one (the other parts' slots are freed); clusters still without one take free
        slots, largest first. Returns slot_of [C], used [K] and the slots given afresh [K]
        (they start from the global model)."""
        slot_of, used = shared.slot_of, shared.used
        old_slot = slot_of[old_roots]
        rank = jnp.where(old_slot >= 0, part_sizes[old_roots], -1)
        best = jnp.full(slot_of.shape, -1, jnp.int32).at[new_roots].max(rank)
        keep = (old_slot >= 0) & (rank == best[new_roots])
        nowhere = slot_of.shape[0]
        carried = jnp.full(slot_of.shape, -1, jnp.int32).at[
            jnp.where(keep, new_roots, nowhere)].max(old_slot, mode="drop")
        freed = jnp.zeros_like(used).at[jnp.where(old_slot >= 0, old_slot, num_slots)].set(
            True, mode="drop")
        kept = carried[new_roots]
        used = (used & ~freed).at[jnp.where(kept >= 0, kept, num_slots)].set(True, mode="drop")
        slot_of = slot_of.at[old_roots].set(-1).at[new_roots].set(kept)
        order = jnp.argsort(-merged_sizes[new_roots], stable=True)

        def give(i, carry):
            slot_of, used, given = carry
            root = new_roots[order[i]]
            free = jnp.argmin(used)
            can = (slot_of[root] < 0) & ~used[free]
            return (slot_of.at[root].set(jnp.where(can, free, slot_of[root])),
                    used.at[free].set(used[free] | can), given.at[free].set(given[free] | can))

        return jax.lax.fori_loop(0, new_roots.shape[0], give,
                                 (slot_of, used, jnp.zeros_like(used)))

    def round_(shared, data, key, hp, exchange):
        clients, psi = exchange.clients, exchange.rows
        train_key, global_key = jax.random.split(training_key(key))
        new = ~shared.observed[clients]
        psi = occasional_cond(
            jnp.any(new),
            lambda: jnp.where(new[:, None], transformed(exchange, representations(
                model.apply, data, shared.anchor, clients, hp.training.lr,
                hp.params.observe_epochs, context.block_size)), psi),
            lambda: psi)
        old_roots = shared.cluster_of[clients]
        size = clients.shape[0]
        same = (old_roots[:, None] == old_roots[None, :]).astype(jnp.float32)
        directions = same @ psi / jnp.sum(same, axis=1, keepdims=True)
        new_roots = merged_roots(old_roots, directions, hp.params.tau)
        part_sizes = jnp.zeros_like(shared.cluster_of).at[shared.cluster_of].add(1)
        # Every client of a merged cluster follows it.
        rename = jnp.arange(shared.cluster_of.shape[0], dtype=jnp.int32).at[old_roots].set(
            new_roots)
        cluster_of = rename[shared.cluster_of]
        merged_sizes = jnp.zeros_like(cluster_of).at[cluster_of].add(1)
        slot_of, used, given = assign_slots(shared, old_roots, new_roots, part_sizes,
                                            merged_sizes)
        slots = jax.tree.map(  # a slot given afresh starts from the global model
            lambda s, g: jnp.where(given.reshape((-1,) + (1,) * (s.ndim - 1)), g[None], s),
            shared.slots, shared.global_model)
        # Local training: each client's cluster model (slot + 1; 0: the global model), pulled
        # toward the global model; then the global model, plain.
        start = jax.tree.map(lambda g, s: jnp.concatenate([g[None], s]), shared.global_model,
                             slots)
        slot = slot_of[new_roots]
        index = (slot + 1).astype(jnp.int32)
        zeros = jnp.zeros((size,), jnp.int32)
        trained, stats, exchange = train_and_collect(
            Start(start, RoundClients(clients, index, anchor_index=zeros),
                  training=hp.training.replace(mu=hp.params.mu)),
            data, train_key, exchange=exchange, block_size=context.block_size)
        ones = jnp.ones((size,), jnp.float32)
        summed, exchange = aggregate(
            context, global_start(shared.global_model, clients, ones, hp.training), data,
            global_key, hp, exchange)
        global_stats = summed.stats
        global_model = jax.tree.map(lambda m: m[0], summed.mean(stack(shared.global_model)))
        members = jax.nn.one_hot(jnp.where(slot >= 0, slot, num_slots), num_slots)  # [S, K]
        averaged, count, exchange = columns_mean_of(trained, members, 1, exchange)
        slots = jax.tree.map(lambda a, s: jnp.where(
            (count > 0).reshape((-1,) + (1,) * (s.ndim - 1)), a, s), averaged, slots)
        metrics = training_metrics(ones, stats)
        metrics["global_train_loss"] = jnp.mean(global_stats.loss)
        metrics["models_down"] = metrics["models_down"] * 2.0  # cluster's and global model
        metrics["models_up"] = metrics["models_up"] * 2.0
        metrics["num_clusters"] = jnp.sum(used).astype(jnp.float32)
        metrics["clients_alone"] = jnp.sum(merged_sizes[cluster_of] <= 1).astype(jnp.float32)
        new_shared = StoCFLShared(global_model, shared.anchor, slots, used, cluster_of,
                                  shared.observed.at[clients].set(True), slot_of)
        return new_shared, metrics, exchange.replace(rows=psi)

    def models(shared, psi, clients):
        del psi
        slot = shared.slot_of[shared.cluster_of[clients]]
        return jax.tree.map(
            lambda g, s: jnp.where((slot >= 0).reshape((-1,) + (1,) * (s.ndim - 1)),
                                   s[jnp.maximum(slot, 0)], g[None]),
            shared.global_model, shared.slots)

    def client_models(shared, data):
        """Models from the rows; the closing embedding trains each client from [1 + K] the
        global model and the slots, its own being its slot + 1 (0: the global model)."""
        del data
        models = jax.tree.map(lambda g, s: jnp.concatenate([g[None], s]), shared.global_model,
                              shared.slots)
        index = (shared.slot_of[shared.cluster_of] + 1).astype(jnp.int32)
        # a client that never trained: the global model or any cluster's
        return RowModels(train_from=(models, index), newcomers=(models, None))

    return FederatedAlgorithm(init, sampled(context.clients_per_round), round_, client_models,
                              lambda shared: shared.slot_of[shared.cluster_of],
                              ClientState(fresh, models, context.store_dtype))
