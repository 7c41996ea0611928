"""Asynchronous aggregation on the simulated clock: FedBuff (Nguyen et al., AISTATS 2022,
"Federated Learning with Buffered Asynchronous Aggregation", Alg. 1), FedAsync (Xie et al.,
2019, "Asynchronous Federated Optimization", Alg. 1) and IFCA's clients under FedBuff's server
(ifca_async).

A run's "round" is one server step: the next arrivals among the `concurrency` clients in
flight (`mcfl.system.events`: one for FedAsync, the buffer's K for FedBuff), trained from the
model versions each started from as one vmapped computation (the skeleton's `aggregate`,
their start rows in the ring of recent versions), then the server's update, the clock moved to
the last arrival, and each freed slot given a new client. ``--scan-rounds`` runs many steps as
one device call. The round's metrics add ``sim_time``, ``staleness`` (mean over the updates
used), ``stale_discarded`` and the clients reported and dropped.

FedBuff's step: ``x <- x + eta_g (1/K) sum_i s(tau_i) Delta_i`` over the K buffered updates
``Delta_i`` (trained minus start model), ``s(tau) = 1 / sqrt(1 + tau)`` by default (the
paper's Sec. 5); each update weighs the same, as in the paper. FedAsync's: ``x <- (1 - a) x +
a y`` with ``a = alpha s(tau)`` for the one arriving model y.

ifca_async: a client chooses, when it starts, the cluster whose model (of the K it downloads)
has the lowest loss on its training data (IFCA's estimate, Ghosh et al. 2020), trains it, and
its update joins that cluster's part of the buffer; a step moves each cluster by FedBuff's rule
over its own arrivals (a cluster without any keeps its model). Clustered FL with asynchronous
clients is studied by CSAFL (Zhang et al., 2021, arXiv:2104.08184: groups by delay and
gradient direction) and CASA (KDD 2024: bi-level asynchronous aggregation with a buffer-aided
clustering); ifca_async is the plain combination of the two papers it names, not either of
those.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.algorithms.clustered.ifca import losses_of_models
from mcfl.algorithms.clustered.shared import cluster_count, cluster_sizes
from mcfl.algorithms.framework.base import FederatedAlgorithm, shared_models, stack, training_key
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import Start, aggregate
from mcfl.engine import RoundClients, client_num_steps
from mcfl.errors import ConfigError
from mcfl.settings import setting
from mcfl.system.devices import SystemModel, model_megabytes
from mcfl.system.events import (
    STALENESS,
    EventClock,
    Ring,
    arrivals,
    dispatch,
    pick_idle,
    replace_slots,
    staleness_weight,
)
from mcfl.system.state import SYSTEM_KEY, initial_system


@dataclasses.dataclass(frozen=True)
class AsyncParams:
    concurrency: int = setting(20, "C: clients training at once", minimum=1)
    staleness: str = setting("polynomial", "s(tau), the weight of an update tau versions old: "
                             "constant | polynomial ((1 + tau)^-a) | hinge (1 up to b, then "
                             "1 / (a (tau - b) + 1))", choices=STALENESS)
    staleness_a: float = setting(0.5, "a of the staleness function (0.5: FedBuff's "
                                 "1 / sqrt(1 + tau))", minimum=0)
    staleness_b: float = setting(4.0, "b of the hinge staleness function", minimum=0)
    max_staleness: int = setting(32, "R - 1: the ring keeps the last R global models; an "
                                 "update started more versions ago is discarded (counted)",
                                 minimum=0)

    def check(self, run) -> None:
        if run.clients is not None and self.concurrency > run.clients:
            raise ConfigError(f"--concurrency {self.concurrency} (C) cannot exceed the number "
                              f"of clients ({run.clients})")

    def unused(self, run) -> dict[str, str]:
        """The staleness function's parameters its rule leaves unused."""
        why = f"is a parameter of the staleness function; --staleness {self.staleness} "
        if self.staleness == "constant":
            return {"staleness_a": why + "weighs every update 1",
                    "staleness_b": why + "weighs every update 1"}
        if self.staleness == "polynomial":
            return {"staleness_b": why + "is (1 + tau)^-a (b is the hinge's)"}
        return {}


@dataclasses.dataclass(frozen=True)
class FedBuffParams(AsyncParams):
    buffer_size: int = setting(10, "K: the server steps after each K arrivals", minimum=1)
    server_lr: float = setting(1.0, "eta_g, the server's step on the mean buffered update",
                               above=0)

    def check(self, run) -> None:
        super().check(run)
        if self.buffer_size > self.concurrency:
            raise ConfigError(f"buffer_size (K = {self.buffer_size}) cannot exceed concurrency "
                              f"(C = {self.concurrency}): the server would wait for more "
                              f"clients than are training")


@dataclasses.dataclass(frozen=True)
class FedAsyncParams(AsyncParams):
    async_alpha: float = setting(0.6, "alpha: the arriving model's share a = alpha s(tau) "
                                 "(Xie et al. 2019 use 0.6 and 0.9)", above=0, maximum=1)


class AsyncState(flax.struct.PyTreeNode):
    """The server's K cluster models now [K, ...] (K = 1: FedBuff, FedAsync), the ring of
    recent versions, each client's cluster [C] (its last choice; ifca_async) and the clock."""

    models: object
    ring: Ring
    assignment: jax.Array
    clock: EventClock


def asynchronous(context: AlgorithmContext, arrivals_per_step, server_update,
                 clustered: bool = False) -> FederatedAlgorithm:
    """The asynchronous algorithm whose steps take ``arrivals_per_step(params)`` arrivals
    (static) and move the models by ``server_update(models [K, ...], sums, starts,
    weight_sums [K], reported [K], params)``: per cluster, the weighted sum of the arriving
    trained models, of the models they started from, the weights' sum, and how many updates
    were used (module docstring)."""
    model = context.model
    system = context.system or SystemModel()
    num_clusters = context.num_clusters if clustered else 1
    model_mb = model_megabytes(jax.eval_shape(model.init, jax.random.key(0)))

    def choose(models, data, clients):
        if not clustered:
            return jnp.zeros_like(clients)
        losses = losses_of_models(model.apply, data, models, clients,
                                  block_size=context.block_size)
        return jnp.argmin(losses, axis=1).astype(jnp.int32)

    def new_clients(key, state_models, data, hp, profile, busy, start, version):
        """Clients for the freed slots [n], asked at times `start` [n] to train from
        `version` (`mcfl.system.events.dispatch`)."""
        pick_key, fail_key = jax.random.split(key)
        clients = pick_idle(pick_key, profile, busy, jnp.max(start), start.shape[0])
        steps = client_num_steps(data.train_counts[clients], hp.training)
        dropout = hp.client_dropout if system.dropout else None
        return dispatch(fail_key, profile, clients, start, version, steps, model_mb,
                        dropout, choose(state_models, data, clients))

    def init(data, key, hp):
        params = hp.params
        if clustered:
            models = jax.vmap(model.init)(jax.random.split(key, num_clusters))
        else:
            models = stack(model.init(key))
        profile = initial_system(system, data.num_clients, key).profile
        population = data.num_clients
        start = jnp.zeros((params.concurrency,), jnp.float32)
        in_flight = new_clients(jax.random.fold_in(key, SYSTEM_KEY), models, data, hp, profile,
                                jnp.zeros((population,), bool), start, 0)
        clock = EventClock(profile, jnp.float32(0.0), jnp.int32(0), in_flight,
                           arrivals_per_step(params))
        everyone = jnp.arange(population, dtype=jnp.int32)
        return AsyncState(models, Ring.of(models, params.max_staleness + 1),
                          choose(models, data, everyone), clock)

    def arriving(state):
        """The step's slots, their clients, staleness and whether each update is used."""
        slots = arrivals(state.clock.in_flight, state.clock.step_size)
        flight = jax.tree.map(lambda x: x[slots], state.clock.in_flight)
        staleness = state.clock.version - flight.version
        used = flight.alive & (staleness < state.ring.size)
        return slots, flight, staleness, used

    def participants(state, data, key, round_):
        del data, key, round_
        _, flight, _, used = arriving(state)
        return flight.client, used.astype(jnp.float32)

    def round_(state, data, key, hp, exchange):
        params = hp.params
        slots, flight, staleness, used = arriving(state)
        clock = state.clock
        weights = staleness_weight(params.staleness, staleness, params.staleness_a,
                                   params.staleness_b) * used
        rows = state.ring.rows(flight.version, flight.cluster)
        start = Start(state.ring.models, RoundClients(flight.client, rows), weights,
                      flight.cluster, num_clusters)
        summed, exchange = aggregate(context, start, data, training_key(key), hp,
                                     exchange)
        starts = state.ring.weighted_starts(rows, flight.cluster, exchange.weigh(weights),
                                            num_clusters)
        reported = jax.ops.segment_sum(used.astype(jnp.float32), flight.cluster, num_clusters)
        models = server_update(state.models, summed.sums, starts, summed.weight_sums, reported,
                               params)
        version = clock.version + 1
        ring = state.ring.put(version, models)
        now = jnp.max(flight.finish)
        # each freed slot's new client starts when its predecessor's update arrived, from
        # the model the server held then: the new version from the step's last arrival on
        begins_new = flight.finish >= now
        busy = jnp.zeros((data.num_clients,), bool).at[clock.in_flight.client].set(True)
        busy = busy.at[flight.client].set(False)
        new = new_clients(jax.random.fold_in(key, SYSTEM_KEY), models, data, hp,
                          clock.profile, busy, flight.finish,
                          jnp.where(begins_new, version, clock.version))
        if clustered:  # a client that starts from the old version chose among its models
            old_choice = choose(state.models, data, new.client)
            new = new.replace(cluster=jnp.where(begins_new, new.cluster, old_choice))
        in_flight = replace_slots(clock.in_flight, slots, new)
        assignment = state.assignment
        if clustered:
            assignment = assignment.at[flight.client].set(
                jnp.where(used, flight.cluster, assignment[flight.client]))
        count = jnp.sum(used.astype(jnp.float32))
        metrics = {**summed.metrics(data), "sim_time": now, "round_seconds": now - clock.time,
                   "staleness": jnp.sum(staleness * used) / jnp.maximum(count, 1.0),
                   "stale_discarded": jnp.sum(flight.alive & ~used).astype(jnp.float32),
                   "clients_sampled": jnp.float32(slots.shape[0]),
                   "clients_reported": count,
                   "clients_dropped": jnp.sum(~flight.alive).astype(jnp.float32),
                   "models_down": jnp.float32(slots.shape[0] * num_clusters),
                   "models_up": count}
        if clustered:
            metrics["num_clusters"] = cluster_count(cluster_sizes(assignment, num_clusters))
        state = AsyncState(models, ring, assignment,
                           clock.replace(time=now, version=version, in_flight=in_flight))
        return state, metrics, exchange

    def client_models(state, data):
        del data
        return shared_models(state.models, state.assignment if clustered else None)

    assignments = (lambda state: state.assignment) if clustered else None
    return FederatedAlgorithm(init, participants, round_, client_models, assignments)


def _per_cluster(x: jax.Array, like: jax.Array) -> jax.Array:
    """[K] as [K, 1, ...] against a [K, ...] leaf."""
    return x.reshape((-1,) + (1,) * (like.ndim - 1))


def fedbuff_update(models, sums, starts, weight_sums, reported, params):
    """FedBuff's step (Alg. 1): each cluster moves by eta_g times the mean of its buffered
    updates ``s(tau_i) Delta_i`` (over the updates used); a cluster without arrivals keeps
    its model."""
    del weight_sums
    return jax.tree.map(lambda m, s, b: jnp.where(
        _per_cluster(reported, m) > 0,
        m + params.server_lr * ((s - b) / jnp.maximum(_per_cluster(reported, s), 1.0))
        .astype(m.dtype), m), models, sums, starts)


def fedasync_update(models, sums, starts, weight_sums, reported, params):
    """FedAsync's step (Alg. 1): ``x <- (1 - a) x + a y`` with ``a = alpha s(tau)`` and y the
    arriving trained model; its weight in the sum is s(tau), so ``a y = alpha * sums`` and
    ``a = alpha * weight_sums`` (0 when the update was not used)."""
    del starts, reported
    return jax.tree.map(lambda m, s: m + params.async_alpha * (
        s - _per_cluster(weight_sums, s) * m.astype(jnp.float32)).astype(m.dtype),
        models, sums)


@register("fedbuff", FedBuffParams, asynchronous=True,
          reference="Nguyen et al., AISTATS 2022, FedBuff",
          summary="asynchronous: C clients train at once; after each K arrivals the server "
          "steps by eta_g times their mean staleness-weighted update (s(tau) = "
          "1/sqrt(1 + tau)); the simulated clock orders the arrivals")
def fedbuff(context: AlgorithmContext) -> FederatedAlgorithm:
    """FedBuff (module docstring); one run round is one server step of K arrivals."""
    return asynchronous(context, lambda p: p.buffer_size, fedbuff_update)


@register("fedasync", FedAsyncParams, asynchronous=True,
          reference="Xie et al., 2019, FedAsync",
          summary="asynchronous: C clients train at once; each arriving model is mixed in, "
          "x <- (1 - a) x + a y with a = alpha s(tau) (polynomial or hinge staleness)")
def fedasync(context: AlgorithmContext) -> FederatedAlgorithm:
    """FedAsync (module docstring); one run round is one arrival."""
    return asynchronous(context, lambda p: 1, fedasync_update)


@register("ifca_async", FedBuffParams, clustered=True, asynchronous=True,
          reference="Ghosh et al., 2020 (IFCA) with Nguyen et al., 2022 (FedBuff)",
          summary="asynchronous IFCA: a client joins the cluster of lowest loss among the K "
          "models it downloads; after each K arrivals every cluster steps by FedBuff's rule "
          "over its own arrivals")
def ifca_async(context: AlgorithmContext) -> FederatedAlgorithm:
    """IFCA's clients under FedBuff's server (module docstring)."""
    return asynchronous(context, lambda p: p.buffer_size, fedbuff_update, clustered=True)
