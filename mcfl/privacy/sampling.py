"""Poisson sampling of a round's clients, in fixed shapes.

Privacy amplification by sampling (the accountant's `PoissonSampledDpEvent`) assumes each of
the N clients joins a round independently with probability q = S / N, so the count varies
from round to round. A compiled round has a fixed number of client slots: `capacity` slots
hold the clients that joined (in a random order) and, after them, clients that did not, which
train like the others but report nothing (``Exchange.present`` is 0 for them: weight 0, no
row written back). The capacity is q N plus six standard deviations of the binomial count;
a round in which more clients join keeps the first `capacity` of them, and counts the others
in the metric ``poisson_overflow`` (the probability per round is below 1e-9 by the normal
tail; the accountant's bound assumes none, and a run's summary reports the total).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from mcfl.algorithms.base import FederatedAlgorithm
from mcfl.engine.sampling import resolve_clients_per_round

TAIL_DEVIATIONS = 6.0


def poisson_capacity(population: int, expected: int) -> int:
    """Client slots of a Poisson-sampled round with `expected` = q N clients on average."""
    rate = expected / population
    spread = math.sqrt(population * rate * (1.0 - rate))
    return int(min(population, max(1, math.ceil(expected + TAIL_DEVIATIONS * spread))))


def poisson_clients(key: jax.Array, population: int, rate: float,
                    capacity: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One round's Poisson sample: ``(clients [capacity], present [capacity], overflow)``:
    each client joins with probability `rate`; the joined come first in a random order,
    then clients that did not join (present 0); `overflow` joined clients had no slot."""
    draws = jax.random.uniform(key, (population,))
    joined = draws < rate
    # joined clients score in [0, rate), the others in [1, 2): the smallest scores first
    score = jnp.where(joined, draws, 1.0 + draws)
    _, clients = jax.lax.top_k(-score, capacity)
    present = joined[clients].astype(jnp.float32)
    overflow = jnp.sum(joined.astype(jnp.int32)) - jnp.sum(present.astype(jnp.int32))
    return clients.astype(jnp.int32), present, overflow


def with_poisson_sampling(algorithm: FederatedAlgorithm,
                          clients_per_round) -> FederatedAlgorithm:
    """`algorithm` whose participants (stage (a)) are a Poisson sample with q = S / N (S from
    the config's `clients_per_round`, resolved against the data's N), in
    `poisson_capacity(N, S)` slots: the participants are ``(clients, present)``, and the
    round's metrics say how many reported (``clients_reported``) and overflowed."""
    def participants(state, data, key, round_):
        del state, round_
        population = data.num_clients
        expected = resolve_clients_per_round(clients_per_round, population)
        capacity = poisson_capacity(population, expected)
        clients, present, _ = poisson_clients(jax.random.split(key)[0], population,
                                              expected / population, capacity)
        return clients, present

    def round_(state, data, key, hp, exchange):
        state, metrics, exchange = algorithm.round(state, data, key, hp, exchange)
        population = data.num_clients
        expected = resolve_clients_per_round(clients_per_round, population)
        capacity = poisson_capacity(population, expected)
        _, _, overflow = poisson_clients(jax.random.split(key)[0], population,
                                         expected / population, capacity)
        metrics = {**metrics, "clients_reported": jnp.sum(exchange.present),
                   "poisson_overflow": overflow.astype(jnp.float32)}
        return state, metrics, exchange

    return algorithm._replace(participants=participants, round=round_)
