"""Any algorithm's synchronous rounds with clients as they are: stage (a) of the round skeleton
(`mcfl.algorithms.framework.skeleton`) on the simulated clock.

`with_system(algorithm, system, ...)` wraps a registered algorithm; its state becomes
``(algorithm's state, SystemState)``, the second holding the devices (`Profile`) and the clock,
so a checkpoint keeps both. Each round:

1. who is asked: the algorithm's own sample, or, with availability or over-selection,
   ``ceil((1 + f) S)`` clients drawn at random among those online now (slots beyond the
   online count stay empty);
2. when each would finish and who reports (`mcfl.system.clock.synchronous_round`): the
   round's `Exchange` carries the reporting mask (``present``: a client that does not report
   weighs nothing, its rows are not written, a cluster or personal model that hears from
   nobody keeps its model) and the steps each finished (``step_limit``: partial work);
3. the algorithm's round, unchanged; then the clock moves by the round's seconds (to the
   next time anyone is online, when nobody was).

A round's metrics gain ``sim_time`` (cumulative simulated seconds at its end),
``round_seconds``, ``clients_sampled``, ``clients_reported`` and ``clients_dropped``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mcfl.algorithms.framework.base import FederatedAlgorithm, PopulationStart, wrapping
from mcfl.engine import client_num_steps
from mcfl.engine.sampling import resolve_clients_per_round
from mcfl.system.clock import synchronous_round
from mcfl.system.devices import Profile, SystemModel, next_online
from mcfl.system.state import SYSTEM_KEY, initial_system, sample_online


def wait_for_anyone(profile: Profile, time) -> jax.Array:
    """Seconds from `time` until some client is online."""
    everyone = jnp.arange(profile.speed.shape[0], dtype=jnp.int32)
    return jnp.min(next_online(profile, everyone, time)) - time


def with_system(algorithm: FederatedAlgorithm, system: SystemModel, clients_per_round,
                model_mb: float) -> FederatedAlgorithm:
    """`algorithm`'s rounds under `system` (module docstring); `clients_per_round` is the S
    the server wants each round (the config's: a count or a fraction of the population),
    `model_mb` a message's size."""

    def init(data, key, hp):
        return algorithm.init(data, key, hp), initial_system(system, data.num_clients, key)

    def participants(state, data, key, round_):
        inner, clock = state
        if system.samples_itself:
            wanted = resolve_clients_per_round(clients_per_round, data.num_clients)
            return sample_online(jax.random.fold_in(key, SYSTEM_KEY), clock.profile,
                                 clock.time, system.slots(wanted))
        return algorithm.participants(inner, data, key, round_)

    def round_(state, data, key, hp, exchange):
        inner, clock = state
        clients = exchange.clients
        sampled = exchange.reporting()
        steps = client_num_steps(data.train_counts[clients], hp.training)
        timing = synchronous_round(system, clock.profile, clients, sampled, steps, model_mb,
                                   clock.time, hp.client_dropout,
                                   jax.random.fold_in(key, SYSTEM_KEY + 1),
                                   resolve_clients_per_round(clients_per_round,
                                                             data.num_clients))
        exchange = exchange.replace(present=timing.present, step_limit=timing.steps)
        inner, metrics, exchange = algorithm.round(inner, data, key, hp, exchange)
        anyone = jnp.sum(sampled) > 0
        seconds = jnp.where(anyone, timing.seconds, wait_for_anyone(clock.profile, clock.time))
        time = clock.time + seconds
        reported = jnp.sum(timing.present)
        if "models_down" in metrics:  # every sampled client downloaded; those that report
            per_client = metrics["models_down"] / jnp.maximum(reported, 1.0)  # counted
            metrics = {**metrics, "models_down": jnp.where(reported > 0, per_client, 1.0)
                       * jnp.sum(sampled)}
        metrics = {**metrics, "sim_time": time, "round_seconds": seconds,
                   "clients_sampled": jnp.sum(sampled), "clients_reported": reported,
                   "clients_dropped": jnp.sum(sampled) - reported}
        return (inner, clock.replace(time=time)), metrics, exchange

    start = None
    inner_start = algorithm.client_state and algorithm.client_state.start
    if inner_start:  # FeSEM's and Robust's population start, on the wrapper's state
        start = PopulationStart(inner_start.points, lambda data, key, hp, source: (
            inner_start.finish(data, key, hp, source),
            initial_system(system, data.num_clients, key)))
    return wrapping(algorithm, init, round_, participants, start=start)
