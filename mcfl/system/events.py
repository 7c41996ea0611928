"""An asynchronous server's clients on the simulated clock: who is training now, from which
model version, and when each one's update arrives.

The server keeps `concurrency` clients in flight (FedBuff's C, Nguyen et al., AISTATS 2022,
Alg. 1; FedAsync's scheduler, Xie et al. 2019). A server step takes the `count` next
arrivals (`arrivals`: the in-flight slots of smallest finish time), and the clock moves to the
last of them. Each arriving client trained from the global model of the version it started
at, kept in a ring of the last R versions (`Ring`): the step trains all of them from their
start versions as one vmapped computation, which gives the same models as training each when
it started, because a client's training depends only on its start model and its key. An
update whose version has left the ring (staleness >= R) is discarded and counted.

Each freed slot gets a new client at once (`dispatch`), drawn at random among the clients
online and not in flight: it starts when its predecessor's update arrived (or when it next
comes online), from the model the server holds then, and arrives after its download, local
steps and upload (`mcfl.system.clock.client_seconds`); it fails on the way with the
dropout chance, or when its online stretch ends first, and then sends nothing.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.system.clock import client_seconds
from mcfl.system.devices import Profile, next_online, online_at, online_until

STALENESS = ("constant", "polynomial", "hinge")


def staleness_weight(kind: str, staleness: jax.Array, a, b) -> jax.Array:
    """s(tau) of Xie et al. 2019 (FedAsync, Sec. 5.2): constant 1; polynomial
    ``(1 + tau)^-a``; hinge ``1`` for tau <= b, else ``1 / (a (tau - b) + 1)``. FedBuff's
    ``1 / sqrt(1 + tau)`` (Nguyen et al. 2022, Sec. 5) is polynomial with a = 0.5."""
    tau = staleness.astype(jnp.float32)
    if kind == "constant":
        return jnp.ones_like(tau)
    if kind == "polynomial":
        return (1.0 + tau) ** (-a)
    return jnp.where(tau <= b, 1.0, 1.0 / (a * (tau - b) + 1.0))


class InFlight(flax.struct.PyTreeNode):
    """The clients training now, one slot each [C]: the client, the model version it started
    from, the simulated time its update arrives, whether it will report, and the cluster it
    chose (0 without clusters)."""

    client: jax.Array
    version: jax.Array
    finish: jax.Array
    alive: jax.Array
    cluster: jax.Array


class EventClock(flax.struct.PyTreeNode):
    """An asynchronous server's clock: the devices, the time, the model version (server steps
    so far), the clients in flight and how many arrivals a server step takes (static)."""

    profile: Profile
    time: Any
    version: Any
    in_flight: InFlight
    step_size: int = flax.struct.field(pytree_node=False, default=1)


def arrivals(in_flight: InFlight, count: int) -> jax.Array:
    """[count] the slots whose updates arrive next (smallest finish time; ties by slot)."""
    _, slots = jax.lax.top_k(-in_flight.finish, count)
    return slots


def pick_idle(key: jax.Array, profile: Profile, busy: jax.Array, time, count: int):
    """[count] distinct clients at random, preferring those online at `time` and not `busy`
    ([C] bool): each ordering of those equally likely (Gumbel top-k); with too few of them
    the rest are offline idle clients, then busy ones."""
    population = profile.speed.shape[0]
    online = online_at(profile, jnp.arange(population, dtype=jnp.int32), time)
    rank = jnp.where(busy, -2e9, jnp.where(online, 0.0, -1e9))
    _, clients = jax.lax.top_k(jax.random.gumbel(key, (population,)) + rank, count)
    return clients.astype(jnp.int32)


def dispatch(key: jax.Array, profile: Profile, clients: jax.Array, start, version,
             steps: jax.Array, model_mb: float, dropout, cluster: jax.Array):
    """Slots for `clients` [n] that are asked at times `start` [n] (each begins when it is
    next online) to train `steps` [n] from model `version` [n]; each fails with chance
    `dropout` (None: never) or when it goes offline before it finishes."""
    begin = next_online(profile, clients, start)
    finish = begin + client_seconds(profile, clients, steps, model_mb)
    alive = finish <= online_until(profile, clients, begin)
    if dropout is not None:
        alive &= jax.random.uniform(key, clients.shape) >= dropout
    return InFlight(clients, jnp.asarray(version, jnp.int32) * jnp.ones_like(clients),
                    finish.astype(jnp.float32), alive, cluster.astype(jnp.int32))


def replace_slots(in_flight: InFlight, slots: jax.Array, new: InFlight) -> InFlight:
    """`in_flight` with the `slots` [n] holding `new` [n]."""
    return jax.tree.map(lambda old, n: old.at[slots].set(n), in_flight, new)


class Ring(flax.struct.PyTreeNode):
    """The last R global models by version: `models` [R * K, ...], version v's K cluster
    models in rows ``(v mod R) K .. (v mod R) K + K - 1`` (K = 1 without clusters)."""

    models: Any
    size: int = flax.struct.field(pytree_node=False)
    clusters: int = flax.struct.field(pytree_node=False, default=1)

    @classmethod
    def of(cls, models, size: int) -> Ring:
        """A ring whose every version is `models` [K, ...] (version 0 before any step)."""
        clusters = jax.tree.leaves(models)[0].shape[0]
        tiled = jax.tree.map(lambda m: jnp.tile(m, (size,) + (1,) * (m.ndim - 1)), models)
        return cls(tiled, size, clusters)

    def rows(self, version: jax.Array, cluster: jax.Array) -> jax.Array:
        """The row of each (version, cluster) pair."""
        return (jnp.mod(version, self.size) * self.clusters + cluster).astype(jnp.int32)

    def at(self, version) -> Any:
        """[K, ...] the models of `version`."""
        first = jnp.mod(version, self.size) * self.clusters
        return jax.tree.map(lambda m: jax.lax.dynamic_slice_in_dim(m, first, self.clusters),
                            self.models)

    def put(self, version, models) -> Ring:
        """The ring with `models` [K, ...] as `version`'s (replacing version - R's)."""
        first = jnp.mod(version, self.size) * self.clusters
        return self.replace(models=jax.tree.map(
            lambda m, n: jax.lax.dynamic_update_slice_in_dim(m, n.astype(m.dtype), first, 0),
            self.models, models))

    def weighted_starts(self, rows: jax.Array, segments: jax.Array, weights: jax.Array,
                        num_segments: int) -> Any:
        """[K', ...] per segment the `weights`-weighted sum of the start models at `rows`
        (what a segment's weighted sum of trained models minus this is: its summed
        updates)."""
        mixing = jnp.zeros((num_segments, self.size * self.clusters), jnp.float32)
        mixing = mixing.at[segments, rows].add(weights.astype(jnp.float32))
        return jax.tree.map(lambda m: jnp.tensordot(mixing, m.astype(jnp.float32), axes=1),
                            self.models)
