"""The round skeleton: the stages of a federated round, written once.

    (a) who takes part          `FederatedAlgorithm.participants`, decided before the round
                                (the run hands them in: ``exchange.clients``)
    (b) where each one starts   the algorithm's `start`: the models, each client's row of them,
                                its aggregation weight and segment (`Start`)
    (c) local training          the engine (`mcfl.engine.train_and_aggregate`)
    (d) the client's message    its update (trained minus start), through the run's message
                                transform (`mcfl.transforms`), inside the engine
    (e) aggregation             the messages' weighted per-segment sums, then the transform's
                                server part (`Aggregate`)
    (f) the server's step       the algorithm's `server`

An algorithm that fits supplies only `init`, `start` and `server` (and how its clients are
evaluated): `skeleton_algorithm`. FedAvg and FedProx, FedDist and FedDWS, Per-FedAvg,
IFCA, FeSEM and FeSEM-MA, and the rounds of FL+HC and PACFL are written so. An algorithm whose
round does not fit one pass (two trainings: Ditto, FedRep, FedDANE; collected messages that the
server needs all at once: CFL, Robust; gradients instead of training: FedSGD; per-client rows
aggregated by hand; stages that read the exchange: FedNova's normalisation by the steps each
client takes) writes its own `round` from the same pieces: the stages (c)-(e) are
`aggregate` (or `mcfl.engine.train_and_collect` and `server_sums` for collected messages), and
every message still passes through the transform, because the engine applies it wherever an
`Exchange` is given. Each such module says why it writes its own round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from mcfl.algorithms.framework.base import (
    ClientModels,
    Exchange,
    FederatedAlgorithm,
    sampled,
    shared_models,
    stack,
    training_key,
    training_metrics,
)
from mcfl.algorithms.framework.registry import AlgorithmContext
from mcfl.engine import (
    UPDATES,
    ClientStats,
    LocalTraining,
    PyTree,
    RoundClients,
    Start,
    segment_mean,
    server_part,
    train_and_aggregate,
)


def global_start(params: PyTree, clients: jax.Array, weights: jax.Array,
                 training: Optional[LocalTraining] = None) -> Start:
    """Every client starts from the one global model `params`; one segment."""
    zeros = jnp.zeros_like(clients)
    return Start(stack(params), RoundClients(clients, zeros), weights, zeros, 1, training)


class Aggregate(NamedTuple):
    """Stages (c)-(e)'s result: the round's `clients` [S], the weighted per-segment sums of
    their messages `sums` [K, ...] and of their weights `weight_sums` [K], each client's
    segment [S], its training stats [S], its weight [S] and the row of the start models it
    started from [S]."""

    clients: jax.Array
    sums: PyTree
    weight_sums: jax.Array
    segments: jax.Array
    stats: ClientStats
    weights: jax.Array
    starts: jax.Array

    def mean(self, fallback: PyTree) -> PyTree:
        """[K, ...] each segment's weighted mean; `fallback`'s row where nothing was summed."""
        return segment_mean(self.sums, self.weight_sums, fallback)

    def metrics(self, data) -> dict[str, jax.Array]:
        """The round's training metrics (`base.training_metrics`, losses weighted by the
        clients' training rows)."""
        return training_metrics(data.train_counts[self.clients], self.stats)


def aggregate(context: AlgorithmContext, start: Start, data, key, hp,
              exchange: Exchange) -> tuple[Aggregate, Exchange]:
    """Stages (c)-(e) for the clients of `start`: train them, transform their messages,
    sum them per segment (in blocks of the run's size), each weighing what the exchange
    makes of the algorithm's weights (`Exchange.weigh`). The start models are the segments'
    reference (what a transform acting on update sums subtracts) when each client is summed
    into the segment of the model it started from."""
    training = hp.training if start.training is None else start.training
    weights = exchange.weigh(start.weights)
    sums, weight_sums, segments, stats, exchange = train_and_aggregate(
        start._replace(training=training, weights=weights, reference=_reference(start)),
        data, key, exchange=exchange, block_size=context.block_size)
    exchange = observed(exchange, stats.update_norm)
    return Aggregate(start.selection.clients, sums, weight_sums, segments, stats,
                     weights, start.selection.start_index), exchange


def observed(exchange: Exchange, norms: jax.Array) -> Exchange:
    """The exchange after its transform observed the round's unclipped update norms [S] of
    the reporting clients (adaptive clipping); as it is for a transform that does not."""
    observe = exchange.transform.observe
    if observe is None:
        return exchange
    present = exchange.reporting()
    key, own = jax.random.split(exchange.key)
    return exchange.replace(transform_state=observe(exchange.transform_state, norms, present,
                                                    own), key=key)


def _reference(start: Start) -> Optional[PyTree]:
    """The start models as the segments' reference, when segment k's clients all started
    from model k (FedAvg's one model, IFCA's chosen cluster); None when a client may be
    summed into another segment than its start's (FeSEM's E-step after training)."""
    if start.reference is not None:
        return start.reference
    count = jax.tree.leaves(start.models)[0].shape[0]
    if start.assign is not None or start.align is not None or count != start.num_segments:
        return None
    return start.models


def server_sums(exchange: Exchange, sums: PyTree, weight_sums: jax.Array, reference=None):
    """Stage (e)'s end for messages an algorithm summed itself (collected with
    `mcfl.engine.train_and_collect`): the transform's server part on the weighted per-segment
    sums [K, ...] and weights [K] (`reference`: as `mcfl.engine.server_part`'s);
    ``(sums, weight_sums, exchange)``."""
    return server_part(exchange, sums, weight_sums, reference)


def transformed(exchange: Exchange, messages: PyTree) -> PyTree:
    """Collected messages [S, ...] that an algorithm forms itself (SCAFFOLD's y_i - x and
    c_i^+ - c_i) through the exchange's transform (stage (d)); as they are without one."""
    transform = exchange.transform
    if transform.client is None:
        return messages
    return jax.vmap(lambda m: transform.client(m, exchange.transform_state))(messages)


def as_messages(exchange: Exchange, trained: PyTree, start: PyTree) -> PyTree:
    """What the server receives of clients that keep their trained models [S, ...] (FedSoft's
    local models): each start [S, ...] plus its update through the exchange's transform; the
    trained models themselves without one."""
    if exchange.transform.client is None:
        return trained
    updates = transformed(exchange, jax.tree.map(jnp.subtract, trained, start))
    return jax.tree.map(jnp.add, start, updates)


def columns_mean_of(messages: PyTree, weights: jax.Array, floor: float, exchange: Exchange,
                    reference=None):
    """[K, ...] the messages [S, ...] averaged with the weights of each column of `weights`
    [S, K] (a client's share in each cluster, as `Exchange.weigh` makes them):
    ``sum_s w_sk x_s / max(sum_s w_sk, floor)``, with the transform's server part on the sums
    when it has one (`reference` [K, ...]: the model each column's messages are updates of);
    ``(means, totals [K], exchange)``."""
    weights = exchange.weigh(weights)
    totals = jnp.sum(weights, axis=0)
    if exchange.transform.server is None:
        scaled = weights.T / jnp.maximum(totals, floor)[:, None]
        return jax.tree.map(lambda x: jnp.tensordot(scaled, x, axes=1), messages), totals, \
            exchange
    sums = jax.tree.map(lambda x: jnp.tensordot(weights.T, x, axes=1), messages)
    sums, totals, exchange = server_part(exchange, sums, totals, reference)
    return jax.tree.map(lambda s: s / jnp.maximum(totals, floor).reshape(
        (-1,) + (1,) * (s.ndim - 1)), sums), totals, exchange


def weighted_mean_of(messages: PyTree, weights: jax.Array, exchange: Exchange,
                     reference=None):
    """The `weights`-weighted mean over the clients of collected messages [S, ...] (the
    personalised algorithms' shared parts; weights as `Exchange.weigh` makes them), with the
    transform's server part on their sum when it has one (`reference`: the model the clients
    started from, unstacked, or `UPDATES` when the messages are updates); ``(mean,
    exchange)``. Without a server part the mean is the weights' shares contracted with the
    messages, as those algorithms always computed it."""
    weights = exchange.weigh(weights)
    if exchange.transform.server is None:
        share = weights / jnp.maximum(jnp.sum(weights), 1e-30)
        return _or_reference(jax.tree.map(
            lambda x: jnp.tensordot(share, x.astype(jnp.float32), axes=1).astype(x.dtype),
            messages), jnp.sum(weights), reference), exchange
    sums = jax.tree.map(lambda x: jnp.tensordot(weights, x.astype(jnp.float32), axes=1)[None],
                        messages)
    sums, totals, exchange = server_part(exchange, sums, jnp.sum(weights)[None],
                                         _one_segment(reference))
    return _or_reference(jax.tree.map(
        lambda s, x: (s[0] / jnp.maximum(totals[0], 1e-30)).astype(x.dtype), sums, messages),
        jnp.sum(weights), reference), exchange


def _or_reference(mean: PyTree, total: jax.Array, reference) -> PyTree:
    """The mean, or the `reference` model when no client reported (total weight 0: everyone
    dropped out, `mcfl.system`), so that a model that hears from nobody keeps its value;
    as it is when the messages are updates (their mean is then 0) or there is no reference."""
    if reference is None or reference is UPDATES:
        return mean
    return jax.tree.map(lambda m, r: jnp.where(total > 0, m, r.astype(m.dtype)), mean,
                        reference)


def plain_mean_of(messages: PyTree, exchange: Exchange, reference=None):
    """The plain mean over the clients of collected messages [S, ...] (those that report),
    with the transform's server part on their sum when it has one (`reference` as
    `weighted_mean_of`'s); ``(mean, exchange)``."""
    if exchange.transform.server is None and exchange.present is None:
        return jax.tree.map(lambda x: jnp.mean(x, axis=0), messages), exchange
    count = jax.tree.leaves(messages)[0].shape[0]
    return weighted_mean_of(messages, jnp.ones((count,), jnp.float32), exchange, reference)


def sum_of(messages: PyTree, exchange: Exchange):
    """The sum over the reporting clients of collected updates [S, ...] (each weighing 1;
    SCAFFOLD's control-variate changes), with the transform's server part on it when it has
    one; ``(sum, exchange)``."""
    present = exchange.reporting()
    if exchange.transform.server is None:
        if exchange.present is None:
            return jax.tree.map(lambda x: jnp.sum(x, axis=0), messages), exchange
        return jax.tree.map(lambda x: jnp.tensordot(present, x, axes=1).astype(x.dtype),
                            messages), exchange
    sums = jax.tree.map(lambda x: jnp.tensordot(present, x.astype(jnp.float32), axes=1)[None],
                        messages)
    sums, _, exchange = server_part(exchange, sums, jnp.sum(present)[None], UPDATES)
    return jax.tree.map(lambda s, x: s[0].astype(x.dtype), sums, messages), exchange


def _one_segment(reference):
    """A reference model as one segment's [1, ...] (`UPDATES` and None as they are)."""
    if reference is None or reference is UPDATES:
        return reference
    return jax.tree.map(lambda r: r[None], reference)


def round_of(context: AlgorithmContext, start: Callable, server: Callable) -> Callable:
    """A `round` from the algorithm's stages: ``start(state, data, clients, hp) -> Start``
    (b) and ``server(state, aggregate, data, hp) -> (state, metrics)`` (f). The round key's
    first half chose the participants (`base.sampled`), its second trains them."""
    def round_(state, data, key, hp, exchange):
        train_key = training_key(key)
        begun = start(state, data, exchange.clients, hp)
        summed, exchange = aggregate(context, begun, data, train_key, hp, exchange)
        state, metrics = server(state, summed, data, hp)
        return state, metrics, exchange

    return round_


def skeleton_algorithm(context: AlgorithmContext, init: Callable, start: Callable,
                       server: Callable, client_models: Callable, assignments=None,
                       client_state=None) -> FederatedAlgorithm:
    """The algorithm whose round is the skeleton's (`round_of`), its clients sampled at random
    (`context.clients_per_round` a round)."""
    return FederatedAlgorithm(init, sampled(context.clients_per_round),
                              round_of(context, start, server), client_models, assignments,
                              client_state)


def global_model(params_of: Callable = lambda state: state.params) -> Callable:
    """`client_models` of an algorithm with one global model: every client is evaluated
    with ``params_of(state)``."""
    def client_models(state, data) -> ClientModels:
        del data
        return shared_models(stack(params_of(state)))

    return client_models
