"""Client schedules: which clients train in each round, when it is not a fresh random draw.

``round_robin_first`` is the client selection of the FlexCFL authors' code (Duan et al.):
the first ``ceil(C / S)`` rounds go through all C clients once, S a round, then every round
samples S clients at random. Here the first pass follows a random order (a keyed permutation
of the clients, drawn from the run's key) rather than the order of the client list, so that
clients of one kind listed together are not trained together. Its use: with S of C clients
at random, a client is still never sampled after R rounds with probability (1 - S/C)^R
(8.6% of FashionMNIST's 500 clients after 60 rounds of 20), and FlexCFL's scoring rule
(every client in a group) cannot score a short run; after the first pass every client has
been seen.

`with_schedule` wraps an algorithm as `mcfl.algorithms.wrappers.shift.with_shift` does: its state
adds the order's key, and its participants (stage (a) of the round) are the schedule's, which the
run hands the inner round in its `Exchange`.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.algorithms.framework.base import (
    FederatedAlgorithm,
    PopulationStart,
    sampling_key,
    training_key,
    wrapping,
)
from mcfl.engine.permutation import permute
from mcfl.engine.sampling import sample_clients

SCHEDULES = ("random", "round_robin_first")


class ScheduleState(flax.struct.PyTreeNode):
    order_key: jax.Array  # key data of the first pass's order (fixed at init)


def first_pass_rounds(num_clients: int, clients_per_round: int) -> int:
    """Rounds of the first pass: ``ceil(C / S)``."""
    return -(-num_clients // clients_per_round)


def scheduled_clients(schedule: ScheduleState, key: jax.Array, num_clients: int,
                      clients_per_round: int, round_) -> jax.Array:
    """Round `round_`'s clients [S] (rounds count from 1; r = round_ - 1 before it): in round
    r < ceil(C / S), positions r S .. r S + S - 1 (mod C) of the keyed order, S distinct
    clients (the last window wraps to the start of the order); after that S at random."""
    order_key = jax.random.wrap_key_data(schedule.order_key)
    done = jnp.asarray(round_, jnp.int32) - 1
    positions = (done * clients_per_round
                 + jnp.arange(clients_per_round, dtype=jnp.int32)) % num_clients
    in_turn = permute(order_key, num_clients, positions)
    at_random = sample_clients(key, num_clients, clients_per_round)
    first_pass = done < first_pass_rounds(num_clients, clients_per_round)
    return jnp.where(first_pass, in_turn, at_random).astype(jnp.int32)


def with_schedule(algorithm: FederatedAlgorithm, schedule: str,
                  clients_per_round: int) -> FederatedAlgorithm:
    """`algorithm` whose rounds train the clients `schedule` names; "random" leaves it as it is
    (each algorithm samples its own clients)."""
    if schedule == "random":
        return algorithm
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown client schedule {schedule!r}; allowed: {SCHEDULES}")

    def init(data, key, hp):
        order_key, inner_key = jax.random.split(key)
        return (algorithm.init(data, inner_key, hp),
                ScheduleState(jax.random.key_data(order_key)))

    def participants(state, data, key, round_):
        return scheduled_clients(state[1], sampling_key(key), data.num_clients,
                                 clients_per_round, round_)

    def round_(state, data, key, hp, exchange):
        inner, schedule_state = state
        inner, metrics, exchange = algorithm.round(inner, data, training_key(key), hp,
                                                   exchange)
        return (inner, schedule_state), metrics, exchange

    start = None
    inner_start = algorithm.client_state and algorithm.client_state.start
    if inner_start:
        start = PopulationStart(
            lambda data, key, hp, clients: inner_start.points(data, training_key(key),
                                                              hp, clients),
            lambda data, key, hp, source: (
                inner_start.finish(data, training_key(key), hp, source),
                ScheduleState(jax.random.key_data(sampling_key(key)))))
    return wrapping(algorithm, init, round_, participants, start=start)
