"""FedGroup (Duan et al., the static-grouping FlexCFL of paper 004, without client migration):
group cold start, newcomer cold start, per-group FedAvg and inter-group aggregation.

Group cold start (Alg. 3): m = alpha * K random clients pre-train from the initial model W_0 and
upload their updates dW (an [m, d] matrix, not centred). Grouping: the EDC embedding (cosine of
each dW_i to the top-K right singular vectors of dW, computed through the m x m Gram matrix) and
k-means++ on its rows, or MADC with complete-linkage clustering. A group's fixed direction dW_g is
its members' mean pre-training update (Alg. 3 lines 16-17).

Newcomer cold start (Sec. 3.4): a client still outside every group pre-trains from W_0 the first
time it is sampled and joins argmin_g (1 - cos(dW_g, dW_i))/2. Only the round's newcomers
pre-train (the others of the sampled batch are inactive, `engine.RoundClients.active`), and
rounds without a newcomer skip the pre-training altogether.

The pre-training is, by default, the paper's (Sec. 3.4): one local epoch from W_0, which the
client goes on from for the rest of its round; or the authors' code's N steps, or mcfl's
earlier whole local training (`mcfl.algorithms.clustered.cold_start`).

Training (Alg. 2): each group runs FedAvg over its sampled members (weighted by n_i); a group
with no sampled member keeps its model; then inter-group aggregation with eta_g > 0:
theta_g <- (theta_g + eta_g S_g) / (1 + eta_g T_g), with S_g = sum_{l != g} theta_l / ||theta_l||
and T_g = sum_{l != g} 1 / ||theta_l||.
A client not yet in a group is evaluated with W_0. With ``evaluate_with="last_received"`` every
client is evaluated with the model it started its last round's training from (its group's model
then; W_0 before its first round, or for a newcomer going on from its pre-training epoch), as
the authors' code tests each member (their group.py: a client's ``latest_params`` are set when
its group broadcasts, lines 149-151, and tested, line 211); that holds a model per client.

FlexCFL adds client migration (Sec. 3.4): before each round, every grouped client compares its
training label distribution with the one it had when it joined its group; beyond
tau_i = 0.2 * n_i / num_classes it redoes its cold start (pre-train from W_0, rejoin by cosine).
The distance is label-aware by default: the 1-D Wasserstein distance over label positions,
n_i * sum_k |CDF_now(k) - CDF_then(k)|. The authors' code instead passes the two count vectors
to a 1-D Wasserstein routine as samples, which ignores which label each count belongs to
(labels {0, 1} -> {2, 3} scores 0); it is kept as ``migration="counts"`` for comparison.
Up to `clients_per_round` migrating clients redo their cold start each round (fixed shapes);
more wait for the next round. The test runs only in rounds where the data moved (the view's
``owners_changed``) or clients are still waiting: label counts change only then.

Defaults: the paper's alpha = 20 (20 K cold-start clients), EDC grouping and one pre-training
epoch (Sec. 3.4); inter-group aggregation off (eta_g 0, the paper's "pluralistic" framework; it
reports eta_g 0.1 and 5.0 helping in some settings, Sec. 5); label-aware migration for FlexCFL
(the code's count-based test is ``migration counts``). The cold start needs alpha K clients:
with fewer, lower ``pretrain_scale``. Measured (REPRODUCTION.md, "Defaults against each paper's
setting"): ARI 33.3 / 74.3 (P(X|Y) / P(Y|X)).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from mcfl.algorithms.clustered.cold_start import (
    PRETRAINS,
    continues,
    group_models_going_on,
    newcomers_as_updates,
    pretrain,
    received_models,
    round_start,
    with_pretraining,
    with_w0,
)
from mcfl.algorithms.clustered.shared import (
    EVALUATIONS,
    cluster_count,
    cluster_means,
    cluster_sizes,
    clustered_algorithm,
    flat_models,
    intra_cluster_distance,
    own_models,
    reassign,
)
from mcfl.algorithms.framework.base import (
    FederatedAlgorithm,
    sampled,
    shared_models,
    stack,
    training_metrics,
)
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.clustering import complete_linkage, cosine_similarity, edc_embedding, kmeans, madc
from mcfl.engine import Start, occasional_cond, segment_mean, train_and_aggregate
from mcfl.engine.sampling import sample_clients
from mcfl.errors import ConfigError
from mcfl.settings import setting

MEASURES = ("edc", "madc", "random")
NEWCOMERS = ("similar", "random")
MIGRATIONS = ("label", "counts")
NEWCOMER_JOINS = ("model", "update")


def label_counts(data) -> jax.Array:
    """[C, num_classes] training label counts of every client as the data is now."""
    return data.train_label_counts.astype(jnp.float32)


def label_shift(now: jax.Array, then: jax.Array, variant: str = "label") -> jax.Array:
    """[C] distance between each client's label counts now and at its assignment.

    "label": n_i * sum_k |CDF_now(k) - CDF_then(k)|, the 1-D Wasserstein distance over label
    positions scaled to counts; "counts": the authors' code, the 1-D Wasserstein distance
    between the two count vectors taken as samples, mean_k |sort(now)_k - sort(then)_k|.
    """
    if variant == "counts":
        return jnp.mean(jnp.abs(jnp.sort(now, axis=1) - jnp.sort(then, axis=1)), axis=1)
    n = now.sum(1, keepdims=True)
    cdf_now = jnp.cumsum(now, axis=1) / jnp.maximum(n, 1)
    cdf_then = jnp.cumsum(then, axis=1) / jnp.maximum(then.sum(1, keepdims=True), 1)
    return n[:, 0] * jnp.sum(jnp.abs(cdf_now - cdf_then), axis=1)


class GroupState(flax.struct.PyTreeNode):
    models: object  # [K, ...] group models
    directions: jax.Array  # [K, d] fixed group update directions dW_g
    assignment: jax.Array  # [C] int32 group of each client, -1 before its cold start
    w0: object  # the initial model (newcomers pre-train from it)
    round: jax.Array
    cold_start_models: jax.Array  # models sent each way by the group cold start (counted once)
    joined_labels: jax.Array  # [C, num_classes] label counts when each client joined its group
    migration_pending: jax.Array  # bool: more clients moved than one round could migrate
    sizes: jax.Array  # [K] clients in each group (kept with `reassign`)
    # [C, ...] the model each client started its last round from (evaluate_with=last_received)
    received: object = None


def group_of_updates(updates: jax.Array, num_groups: int, measure: str, key) -> jax.Array:
    """[m] group of each pre-training update [m, d]: EDC + k-means++, MADC + complete linkage,
    or (FlexCFL's RCC ablation) K random clients' updates as the groups' directions, every
    client joining the one its update is most similar to (as a newcomer joins)."""
    if measure == "edc":
        return kmeans(key, edc_embedding(updates, num_groups), num_groups, restarts=10).labels
    if measure == "madc":
        return complete_linkage(madc(updates), num_groups)
    centers = sample_clients(key, updates.shape[0], num_groups)
    labels = jnp.argmax(cosine_similarity(updates, updates[centers]), axis=1).astype(jnp.int32)
    return labels.at[centers].set(jnp.arange(num_groups, dtype=jnp.int32))


def inter_group_aggregation(models, eta_g: float):
    """FlexCFL Alg. 2 line 13 on flattened parameters, in the normalised form of the module
    docstring (S_g and T_g over the other groups' unit-norm models)."""
    flat = flat_models(models)  # [K, d]
    norms = jnp.maximum(jnp.linalg.norm(flat, axis=1, keepdims=True), 1e-12)  # [K, 1]
    others = jnp.sum(flat / norms, axis=0, keepdims=True) - flat / norms  # sum over l != g
    inv_others = jnp.sum(1.0 / norms) - 1.0 / norms
    mixed = (flat + eta_g * others) / (1.0 + eta_g * inv_others)
    _, unravel = ravel_pytree(jax.tree.map(lambda m: m[0], models))
    return jax.vmap(unravel)(mixed)


@dataclasses.dataclass(frozen=True)
class FedGroupParams:
    pretrain_scale: int = setting(20, "alpha: alpha * K clients pre-train for the group cold "
                                  "start", minimum=1)
    measure: str = setting("edc", "grouping of the cold-start updates: edc (+ k-means++), madc "
                           "(+ complete linkage), or random (the RCC ablation: K random "
                           "clients' updates as group directions)", choices=MEASURES)
    eta_g: float = setting(0.0, "inter-group aggregation rate (0: none)", minimum=0)
    newcomers: str = setting("similar", "a newcomer joins the most similar group after "
                             "pre-training, or a random one without pre-training (the RAC "
                             "ablation)", choices=NEWCOMERS)
    pretrain: str = setting("epoch", "a cold start's pre-training from W_0: epoch (the paper, "
                            "Sec. 3.4: one local epoch, then the client goes on for its other "
                            "E - 1 epochs in the same round) | full (the whole local training, "
                            "then E epochs from its group's model: mcfl's earlier form, neither "
                            "the paper's nor the authors' code's)", choices=PRETRAINS)
    pretrain_steps: Optional[int] = setting(None, "pre-train N mini-batch steps from W_0 "
                                            "instead of the paper's epoch, then train E epochs "
                                            "from the group's model (the authors' code: 50); "
                                            "none: --pretrain", minimum=1)
    evaluate_with: str = setting("current", "the model a client is evaluated with: current "
                                 "(its group's now) | last_received (the one it started its "
                                 "last round from: the authors' code; a model per client)",
                                 choices=EVALUATIONS)
    newcomer_join: str = setting("model", "how a newcomer that goes on from its pre-training "
                                 "epoch (--pretrain epoch) enters its group's aggregation: "
                                 "model (its trained model is averaged in) | update (its update "
                                 "from W_0 is applied to the group's model, as the authors' "
                                 "update-based FedAvg would take the paper's 'upload the "
                                 "parameters updates for the intra-group aggregation')",
                                 choices=NEWCOMER_JOINS)

    def check(self, run) -> None:
        if self.pretrain == "full" and self.pretrain_steps is not None:
            raise ConfigError(f"pretrain_steps replaces the paper's pre-training epoch; give "
                              f"it or pretrain=full, not both (got pretrain_steps="
                              f"{self.pretrain_steps})")
        going_on = self.pretrain == "epoch" and self.pretrain_steps is None
        if self.newcomer_join == "update" and not (going_on and self.newcomers == "similar"):
            raise ConfigError(
                "newcomer_join=update needs the paper's pre-training (pretrain=epoch, no "
                "pretrain_steps, newcomers=similar): only then does a newcomer go on from W_0; "
                f"got pretrain={self.pretrain}, pretrain_steps={self.pretrain_steps}, "
                f"newcomers={self.newcomers}")
        needed = self.pretrain_scale * run.clusters
        if run.clients is not None and needed > run.clients:
            raise ConfigError(
                f"the group cold start needs pretrain_scale * clusters = {self.pretrain_scale} "
                f"* {run.clusters} = {needed} clients, more than the {run.clients} "
                "clients; lower --pretrain-scale or --clusters")


@dataclasses.dataclass(frozen=True)
class FlexCFLParams(FedGroupParams):
    migration: str = setting("label", "the shift test: label (label-aware Wasserstein) or "
                             "counts (the authors' code)", choices=MIGRATIONS)


@register("fedgroup", FedGroupParams, clustered=True,
          reference="Duan et al., 2021, FlexCFL (FedGroup: without migration)",
          summary="group cold start: alpha*K clients pre-train from W_0 (one epoch, then they "
          "go on for the round's other E - 1) and are grouped by EDC (or MADC); newcomers "
          "pre-train when first sampled and join the most similar group; FedAvg per group, "
          "optional inter-group aggregation (eta_g)")
def fedgroup(context: AlgorithmContext, migrates: bool = False) -> FederatedAlgorithm:
    """FedGroup with K = ``context.num_clusters`` groups found from pretrain_scale * K
    pre-trained clients; with `migrates` (the test: ``hp.params.migration``) it is FlexCFL
    (`flexcfl`)."""
    model, clients_per_round = context.model, context.clients_per_round
    num_groups = context.num_clusters
    block_size = context.block_size

    def init(data, key, hp):
        init_key, pick_key, train_key, group_key = jax.random.split(key, 4)
        w0 = model.init(init_key)
        m = hp.params.pretrain_scale * num_groups
        cold = sample_clients(pick_key, data.num_clients, m)
        updates, trained, taken, _ = pretrain(data, train_key, w0, cold, hp,
                                              block_size=block_size)
        labels = group_of_updates(updates, num_groups, hp.params.measure, group_key)
        if continues(hp.params):
            models = group_models_going_on(data, jax.random.fold_in(train_key, 1), trained, cold,
                                           taken, labels, num_groups, hp, block_size)
            directions = cluster_means(updates, labels, num_groups)
        else:
            models = cluster_means(trained, labels, num_groups)
            directions = flat_models(models) - ravel_pytree(w0)[0][None]
        assignment = jnp.full((data.num_clients,), -1, jnp.int32).at[cold].set(labels)
        last = hp.params.evaluate_with == "last_received"
        received = stack(w0, data.num_clients) if last else None
        return GroupState(models, directions, assignment, w0, jnp.zeros((), jnp.int32),
                          jnp.float32(m), label_counts(data), jnp.zeros((), bool),
                          cluster_sizes(assignment, num_groups), received)

    def join(state, data, key, clients, active, hp, exchange):
        """Groups the `active` clients join after pre-training from W_0: argmin_g (1 - cos) / 2
        (computed only in rounds with at least one, under `lax.cond`); under RAC, random
        groups without pre-training. Also their pre-trained models [S, ...] when they go on
        from them (the paper; else None), pre-training steps [S] and summed losses [S]."""
        none, zero = jnp.zeros_like(clients), jnp.zeros(clients.shape, jnp.float32)
        if hp.params.newcomers == "random":
            groups = jax.random.randint(key, clients.shape, 0, num_groups, jnp.int32)
            return groups, None, none, zero
        keep = continues(hp.params)

        def pretrain_and_join(_):
            updates, trained, taken, losses = pretrain(data, key, state.w0, clients, hp, active,
                                                       exchange=exchange,
                                                       block_size=block_size)
            cos = cosine_similarity(updates, state.directions)  # [S, K]
            groups = jnp.argmin((1.0 - cos) / 2.0, axis=1).astype(jnp.int32)
            return groups, trained if keep else None, taken, losses

        def nobody(_):
            return none, stack(state.w0, clients.shape[0]) if keep else None, none, zero

        return occasional_cond(jnp.any(active), pretrain_and_join, nobody, None)

    def migrate(state, data, key, hp, exchange):
        """Redo the cold start of up to S clients whose label distribution moved (FlexCFL)."""
        now = label_counts(data)
        tau = 0.2 * now.sum(1) / data.num_classes
        shift = label_shift(now, state.joined_labels, hp.params.migration)
        moved = (state.assignment >= 0) & (shift > tau)
        batch = jnp.argsort(~moved, stable=True)[:clients_per_round].astype(jnp.int32)
        valid = moved[batch]
        groups = jnp.where(valid, join(state, data, key, batch, valid, hp, exchange)[0],
                           state.assignment[batch])
        assignment, sizes = reassign(state.assignment, state.sizes, batch, groups)
        target = jnp.where(valid, batch, data.num_clients)  # out of range: dropped
        joined = state.joined_labels.at[target].set(now[batch], mode="drop")
        pending = jnp.sum(moved) > clients_per_round
        return (state.replace(assignment=assignment, sizes=sizes, joined_labels=joined,
                              migration_pending=pending), jnp.sum(valid))

    def round_(state, data, key, hp, exchange):
        """Migration, newcomers' pre-training and the groups' FedAvg with their own keys, so
        the round is written here from the skeleton's pieces; the pre-training updates and
        the trained models are messages through the run's transform."""
        _, cold_key, train_key, migrate_key = jax.random.split(key, 4)
        migrated = jnp.zeros((), jnp.int32)
        if migrates:
            # Label counts change only when the data moves: test all clients only then.
            state, migrated = occasional_cond(
                data.owners_changed | state.migration_pending,
                lambda s: migrate(s, data, migrate_key, hp, exchange),
                lambda s: (s, jnp.zeros((), jnp.int32)), state)
        clients = exchange.clients
        current = state.assignment[clients]
        newcomer = current < 0
        joined, pretrained, taken, losses = join(state, data, cold_key, clients, newcomer, hp,
                                                 exchange)
        group = jnp.where(newcomer, joined, current)
        counts = data.train_counts[clients]
        weights = exchange.weigh(counts)  # 0 for a client that does not report
        goes_on = pretrained is not None
        start_models, selection = round_start(state.models, pretrained, clients, group,
                                              newcomer, taken, counts, hp.training)
        sums, weight_sums, _, stats, exchange = train_and_aggregate(
            Start(start_models, selection, weights, group, num_groups, training=hp.training),
            data, train_key, exchange=exchange, block_size=block_size)
        if goes_on and hp.params.newcomer_join == "update":
            sums = newcomers_as_updates(sums, state.models, state.w0, weights, newcomer, group)
        # Inter-group aggregation always runs: at eta_g = 0 it returns the models unchanged.
        models = inter_group_aggregation(segment_mean(sums, weight_sums, state.models),
                                         hp.params.eta_g)
        # a client that did not report (dropped out, `mcfl.system`) joins nothing this round
        reported = exchange.reporting() > 0
        group = jnp.where(reported, group, current)
        newcomer = newcomer & reported
        assignment, sizes = reassign(state.assignment, state.sizes, clients, group)
        joined_labels = state.joined_labels.at[jnp.where(newcomer, clients, data.num_clients)].set(
            label_counts(data)[clients], mode="drop")
        metrics = training_metrics(weights, with_pretraining(stats, taken, losses, goes_on))
        # A pre-training client downloads W_0 and uploads dW once (not under RAC: newcomers
        # pre-train nothing); going on from it (the paper), it downloads no group model and
        # also uploads its trained model. The group cold start is counted in round 1.
        random = hp.params.newcomers == "random"
        joining = jnp.float32(0) if random else jnp.sum(newcomer).astype(jnp.float32)
        migrating = jnp.float32(0) if random else migrated.astype(jnp.float32)
        first = jnp.where(state.round == 0, state.cold_start_models, 0.0)
        up = joining + migrating + first * (2.0 if continues(hp.params) else 1.0)
        down = up - (joining if goes_on else 0.0) - (first if continues(hp.params) else 0.0)
        metrics["models_down"] = metrics["models_down"] + down
        metrics["models_up"] = metrics["models_up"] + up
        metrics["intra_cluster_distance"] = intra_cluster_distance(
            sums, weight_sums, stats, weights)
        metrics["num_clusters"] = cluster_count(sizes)
        metrics["unassigned_clients"] = (data.num_clients - jnp.sum(sizes)).astype(jnp.float32)
        metrics["migrated_clients"] = migrated.astype(jnp.float32)
        received = None if state.received is None else received_models(
            state.received, state.models, state.w0, clients, group, newcomer, goes_on)
        new_state = state.replace(models=models, assignment=assignment, sizes=sizes,
                                  round=state.round + 1, joined_labels=joined_labels,
                                  received=received)
        return new_state, metrics, exchange

    def client_models(state, data):
        del data
        newcomers = (state.models, None)  # a client that never trained: any group's model
        if state.received is not None:  # last_received: each client its own
            return shared_models(*own_models(state.received), newcomers=newcomers)
        # Clients outside every group are evaluated with W_0, appended as model K.
        return shared_models(with_w0(state.models, state.w0),
                             jnp.where(state.assignment < 0, num_groups, state.assignment),
                             newcomers=newcomers)

    # (the first of the round key's four parts samples the clients)
    return clustered_algorithm(
        context, init, round_,
        participants=sampled(clients_per_round, lambda key: jax.random.split(key, 4)[0]),
        client_models=client_models)


@register("flexcfl", FlexCFLParams, clustered=True, reference="Duan et al., 2021, FlexCFL",
          summary="FedGroup plus client migration: before each round, a grouped client whose "
          "label distribution moved more than tau_i = 0.2 n_i / classes redoes its cold start")
def flexcfl(context: AlgorithmContext) -> FederatedAlgorithm:
    """FlexCFL (paper 004): FedGroup plus client migration under distribution shift."""
    return fedgroup(context, migrates=True)
