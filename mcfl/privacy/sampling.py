"""Poisson sampling of a round's clients, in fixed shapes.

Privacy amplification by sampling (the accountant's `PoissonSampledDpEvent`) assumes each of
the N clients joins a round independently with probability q = S / N, so the count varies
from round to round. A compiled round has a fixed number of client slots: `capacity` slots
hold the clients that joined (in a random order) and, after them, clients that did not, which
train like the others but report nothing (``Exchange.present`` is 0 for them: weight 0, no
row written back). The capacity is q N plus six standard deviations of the binomial count;
a round in which more clients join keeps the first `capacity` of them, and counts the others
in the metric ``poisson_overflow`` (the probability per round is below 1e-9 by the normal
tail; the accountant's bound assumes none, and a run's summary reports the total). An
algorithm's rounds take their clients so through `mcfl.algorithms.wrappers.poisson`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

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
