"""A synchronous round on the simulated clock: when each sampled client would finish, who
reports, how much of its work it did, and how long the round lasts.

A client of the round downloads the model, trains its local steps and uploads its update:
``seconds = 2 (model_mb / bandwidth + latency) + steps / speed`` (`client_seconds`). Then:

* a client fails at random with chance P (``--client-dropout``) and sends nothing (noticed at
  once); a client whose online stretch ends before it finishes goes offline and sends nothing
  (noticed when it goes offline: the round lasts at least until then, so the clock moves on
  even when every sampled client goes offline);
* with a deadline D, a client that cannot finish by D reports the steps it finished by then
  (``partial``: ``floor((D - messages) speed)`` of them, none if its messages alone pass D) or
  nothing (``drop``);
* with over-selection (Bonawitz et al., MLSys 2019, Sec. 2.2), the first S to finish report
  and the rest are discarded.

The round lasts until its last report arrives (or its last client goes offline); with a
deadline, until the deadline whenever fewer than S clients reported (the server cannot tell a
failed client from a slow one, so it waits for the deadline). Without a deadline a client that
fails at random is noticed at once.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from mcfl.system.devices import Profile, SystemModel, online_until


class RoundTiming(NamedTuple):
    """What the clock makes of a round's sampled clients [S]: which report (`present`,
    float32), how many local steps each did (`steps`, int32), and the round's `seconds`."""

    present: jax.Array
    steps: jax.Array
    seconds: jax.Array


def message_seconds(profile: Profile, clients: jax.Array, model_mb: float) -> jax.Array:
    """[S] seconds a client spends on messages: the model down and its update up."""
    return 2.0 * (model_mb / profile.bandwidth[clients] + profile.latency[clients])


def client_seconds(profile: Profile, clients: jax.Array, steps: jax.Array,
                   model_mb: float) -> jax.Array:
    """[S] seconds from a client's download to its update's arrival, for `steps` local
    steps."""
    return message_seconds(profile, clients, model_mb) + steps / profile.speed[clients]


def synchronous_round(system: SystemModel, profile: Profile, clients: jax.Array,
                      sampled: jax.Array, steps: jax.Array, model_mb: float, time,
                      dropout, key: jax.Array, target: int) -> RoundTiming:
    """The timing of a round that starts at `time` with `clients` [S'] (`sampled` [S']:
    1.0 for real participants, 0.0 for empty slots) that would each train `steps` [S']
    local steps; `dropout` is the failure chance (traced; unused unless `system.dropout`)
    and `target` the S the server wants (less than S' with over-selection)."""
    messages = message_seconds(profile, clients, model_mb)
    full = messages + steps / profile.speed[clients]
    done = steps
    deadline: Optional[float] = system.deadline
    if deadline is not None:
        if system.deadline_policy == "partial":
            finished = jnp.floor((deadline - messages) * profile.speed[clients])
            done = jnp.clip(finished, 0, steps).astype(steps.dtype)
        else:
            done = jnp.where(full <= deadline, steps, 0)
    finish = messages + done / profile.speed[clients]
    alive = (sampled > 0) & (done > 0)
    if system.dropout:
        alive &= jax.random.uniform(key, clients.shape) >= dropout
    # a client whose online stretch ends first goes offline then, its work lost: the server
    # hears of it at that moment (not at once), so a round whose clients all go offline still
    # lasts until the last of them does, and the clock moves on
    until = online_until(profile, clients, time)
    # clients always online (a static fact of the profile): no offline term in the program,
    # which stays the one of a run without availability (its rounding too, with XLA's passes
    # off as in the suite: tests/test_system.py checks a dropout of 0 against no system)
    always_online = math.isinf(profile.period)
    if always_online:
        alive &= time + finish <= until
    else:
        offline = alive & (time + finish > until)
        alive &= ~offline
    if system.over_select > 0:  # the first `target` to finish
        order = jnp.argsort(jnp.where(alive, finish, jnp.inf))
        rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0]))
        alive &= rank < target
    last = jnp.max(jnp.where(alive, finish, 0.0))
    if not always_online:
        last = jnp.maximum(last, jnp.max(jnp.where(offline, until - time, 0.0)))
    seconds = last
    if deadline is not None:
        wanted = jnp.minimum(target, jnp.sum(sampled > 0))
        seconds = jnp.where(jnp.sum(alive) < wanted, jnp.float32(deadline), last)
    present = alive.astype(jnp.float32)
    return RoundTiming(present, jnp.where(alive, done, 0).astype(jnp.int32),
                       seconds.astype(jnp.float32))
