"""The state a device model adds to a run (the devices and the simulated clock) and how a
round's askers are drawn among the clients online: shared by the synchronous wrapper
(`mcfl.algorithms.wrappers.system_rounds`) and the asynchronous servers
(`mcfl.algorithms.asynchronous.servers`)."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.system.devices import Profile, SystemModel, draw_profile, online_at

# Folded into keys for what the clock draws (the devices, who is asked, who fails), so that
# it draws nothing the algorithm draws.
SYSTEM_KEY = 0x5359
PROFILE_KEY = 0x5350


class SystemState(flax.struct.PyTreeNode):
    """The devices and the simulated clock (seconds since the run began)."""

    profile: Profile
    time: Any


def initial_system(system: SystemModel, num_clients: int, key: jax.Array) -> SystemState:
    """The devices drawn from the run's key, the clock at 0."""
    profile = draw_profile(system, num_clients, jax.random.fold_in(key, PROFILE_KEY))
    return SystemState(profile, jnp.float32(0.0))


def sample_online(key: jax.Array, profile: Profile, time, count: int):
    """``(clients [count], sampled [count] float32)``: `count` distinct clients at random
    among those online at `time` (Gumbel top-k: each ordering of them equally likely); the
    slots beyond the online count hold offline clients, marked 0."""
    population = profile.speed.shape[0]
    everyone = jnp.arange(population, dtype=jnp.int32)
    online = online_at(profile, everyone, time)
    scores = jax.random.gumbel(key, (population,)) + jnp.where(online, 0.0, -jnp.inf)
    _, clients = jax.lax.top_k(scores, count)
    return clients.astype(jnp.int32), online[clients].astype(jnp.float32)
