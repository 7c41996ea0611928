"""Poisson-sampled participants for any algorithm (stage (a) of the round): the round's
clients in fixed slots, those that joined first (`mcfl.privacy.sampling`), with the
``present`` mask the run hands the round in its `Exchange`."""

from __future__ import annotations

import jax.numpy as jnp

from mcfl.algorithms.framework.base import FederatedAlgorithm, sampling_key
from mcfl.engine.sampling import resolve_clients_per_round
from mcfl.privacy.sampling import poisson_capacity, poisson_clients


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
        clients, present, _ = poisson_clients(sampling_key(key), population,
                                              expected / population, capacity)
        return clients, present

    def round_(state, data, key, hp, exchange):
        state, metrics, exchange = algorithm.round(state, data, key, hp, exchange)
        population = data.num_clients
        expected = resolve_clients_per_round(clients_per_round, population)
        capacity = poisson_capacity(population, expected)
        _, _, overflow = poisson_clients(sampling_key(key), population,
                                         expected / population, capacity)
        metrics = {**metrics, "clients_reported": jnp.sum(exchange.present),
                   "poisson_overflow": overflow.astype(jnp.float32)}
        return state, metrics, exchange

    return algorithm._replace(participants=participants, round=round_)
