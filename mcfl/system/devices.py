"""Every client's device: compute speed, network and availability, and the settings that
describe them (`SystemModel`).

A client's device is three numbers and a schedule (`Profile`, [C] arrays in the algorithm's
state, so a checkpoint keeps them):

* speed: local training steps per simulated second;
* bandwidth: megabytes per second, the same both ways (a message is the model's float32
  parameters: `model_megabytes`); latency: seconds added to each message;
* availability: intervals of a repeating cycle (``period`` seconds) in which the client is
  online; a client with none is always online.

They are drawn from named distributions with the run's key (``lognormal:0,1``: steps per
second e^N(0, 1); `parse_distribution`) or read from a trace file (`mcfl.system.trace`).
Availability is ``always``, ``diurnal:PERIOD,ON`` (each client online for the fraction ON of
every PERIOD seconds, from a phase drawn uniformly: the day-night pattern FedScale's traces
show, Lai et al., OSDI 2021 / ICML 2022) or ``trace:PERIOD`` (the trace's intervals).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from mcfl.errors import ConfigError
from mcfl.system.trace import read_trace

DISTRIBUTIONS = {  # name -> (parameters, example)
    "constant": (("value",), "constant:2"),
    "uniform": (("low", "high"), "uniform:0.5,2"),
    "lognormal": (("mu", "sigma"), "lognormal:0,1"),
    "pareto": (("shape", "scale"), "pareto:1.5,1"),
}
AVAILABILITY = ("always", "diurnal:PERIOD,ON_FRACTION", "trace:PERIOD")
DEADLINE_POLICIES = ("partial", "drop")


class Distribution(NamedTuple):
    """A named distribution of positive numbers (`DISTRIBUTIONS`)."""

    name: str
    params: tuple[float, ...]

    def draw(self, key: jax.Array, count: int) -> jax.Array:
        """[count] float32 draws."""
        a = self.params
        if self.name == "constant":
            return jnp.full((count,), a[0], jnp.float32)
        if self.name == "uniform":
            return jax.random.uniform(key, (count,), jnp.float32, a[0], a[1])
        if self.name == "lognormal":
            return jnp.exp(a[0] + a[1] * jax.random.normal(key, (count,), jnp.float32))
        # pareto: scale * U^(-1/shape), U in (0, 1]: heavy-tailed above `scale`
        u = 1.0 - jax.random.uniform(key, (count,), jnp.float32)
        return a[1] * u ** (-1.0 / a[0])


def parse_distribution(text: str, what: str) -> Distribution:
    """``name:a,b`` as a `Distribution` of positive numbers; `what` names the flag in the
    error (``--device-speeds``)."""
    allowed = ", ".join(example for _, example in DISTRIBUTIONS.values())
    if not isinstance(text, str):
        raise ConfigError(f"{what} must be text such as {allowed}, got {text!r}")
    name, _, rest = text.partition(":")
    if name not in DISTRIBUTIONS:
        raise ConfigError(f"{what} {text!r}: unknown distribution {name!r}; allowed: {allowed}")
    names, example = DISTRIBUTIONS[name]
    try:
        params = tuple(float(p) for p in rest.split(",")) if rest else ()
    except ValueError:
        raise ConfigError(f"{what} {text!r}: the parameters must be numbers, as in "
                          f"{example}") from None
    if len(params) != len(names) or not all(math.isfinite(p) for p in params):
        raise ConfigError(f"{what} {text!r}: {name} takes {len(names)} finite number(s) "
                          f"({', '.join(names)}), as in {example}")
    rules = {"constant": lambda v: v[0] > 0, "uniform": lambda v: 0 < v[0] < v[1],
             "lognormal": lambda v: v[1] >= 0, "pareto": lambda v: min(v) > 0}
    if not rules[name](params):
        rule = {"constant": "value > 0", "uniform": "0 < low < high",
                "lognormal": "sigma >= 0", "pareto": "shape > 0 and scale > 0"}[name]
        raise ConfigError(f"{what} {text!r}: {name} needs {rule}")
    return Distribution(name, params)


class Availability(NamedTuple):
    """When clients are online: `kind` always | diurnal | trace, the cycle's `period` in
    seconds, and the diurnal on-fraction."""

    kind: str = "always"
    period: float = math.inf
    on_fraction: float = 1.0


def parse_availability(text: str) -> Availability:
    """``always``, ``diurnal:PERIOD,ON_FRACTION`` or ``trace:PERIOD`` (`AVAILABILITY`)."""
    allowed = ", ".join(AVAILABILITY)
    if not isinstance(text, str):
        raise ConfigError(f"--availability must be one of {allowed}, got {text!r}")
    kind, _, rest = text.partition(":")
    if kind == "always" and not rest:
        return Availability()
    try:
        values = tuple(float(v) for v in rest.split(",")) if rest else ()
    except ValueError:
        values = None
    if kind == "diurnal" and values is not None and len(values) == 2:
        period, on = values
        if not (math.isfinite(period) and period > 0 and 0 < on <= 1):
            raise ConfigError(f"--availability {text!r}: diurnal needs PERIOD > 0 seconds and "
                              f"0 < ON_FRACTION <= 1 (with 0 nobody is ever available)")
        return Availability("diurnal", period, on)
    if kind == "trace" and values is not None and len(values) == 1:
        if not (math.isfinite(values[0]) and values[0] > 0):
            raise ConfigError(f"--availability {text!r}: trace needs PERIOD > 0 seconds (the "
                              f"cycle the trace's intervals repeat in)")
        return Availability("trace", values[0])
    raise ConfigError(f"--availability must be one of {allowed}, got {text!r}")


@dataclasses.dataclass(frozen=True)
class SystemModel:
    """The run's clients as they are (static: it shapes the program). `speeds` and
    `bandwidth`: distributions (None: 1 step a second, messages take no time), or the
    `trace` file's columns; `latency` seconds per message; `availability`; `dropout`:
    whether clients fail at random (the chance itself is ``hp.client_dropout``, traced);
    `deadline` seconds and what a client cut by it does (`deadline_policy`); `over_select`:
    the extra fraction of clients sampled, of which the first S to finish are kept."""

    speeds: Optional[Distribution] = None
    bandwidth: Optional[Distribution] = None
    latency: float = 0.0
    trace: Optional[str] = None
    availability: Availability = Availability()
    dropout: bool = False
    deadline: Optional[float] = None
    deadline_policy: str = "partial"
    over_select: float = 0.0

    def slots(self, clients_per_round: int) -> int:
        """The clients sampled a round: ``ceil((1 + over_select) S)``."""
        return int(math.ceil((1.0 + self.over_select) * clients_per_round - 1e-9))

    @property
    def samples_itself(self) -> bool:
        """Whether the round's participants are drawn here (among the online clients, or more
        than S of them) rather than by the algorithm's own sampling."""
        return self.availability.kind != "always" or self.over_select > 0


def system_model(device_speeds: Optional[str] = None, bandwidth: Optional[str] = None,
                 latency: float = 0.0, device_trace: Optional[str] = None,
                 availability: str = "always", client_dropout: Optional[float] = None,
                 deadline: Optional[float] = None, deadline_policy: str = "partial",
                 over_select: float = 0.0) -> Optional[SystemModel]:
    """The `SystemModel` these settings (the flags of the same names) describe, or None when
    they describe nothing (the run is then exactly a run without one; an asynchronous server
    runs on the default clock). Each text is parsed here; a deadline policy without a deadline
    is refused in one line."""
    given = (device_speeds is not None or bandwidth is not None or latency > 0
             or device_trace is not None or availability != "always"
             or client_dropout is not None or deadline is not None or over_select > 0)
    if deadline is None and deadline_policy != "partial":
        raise ConfigError(f"--deadline-policy {deadline_policy} says what a client cut by "
                          f"--deadline does; this run sets no --deadline")
    if not given:
        return None
    return SystemModel(
        speeds=None if device_speeds is None
        else parse_distribution(device_speeds, "--device-speeds"),
        bandwidth=None if bandwidth is None else parse_distribution(bandwidth, "--bandwidth"),
        latency=float(latency),
        trace=device_trace,
        availability=parse_availability(availability),
        dropout=client_dropout is not None,
        deadline=deadline,
        deadline_policy=deadline_policy,
        over_select=float(over_select),
    )


class Profile(flax.struct.PyTreeNode):
    """The population's devices, [C] each (module docstring): `online` [C, J, 2] intervals of
    a cycle of `period` seconds ((0, 0) pads), `online_count` [C] (0: always online)."""

    speed: jax.Array
    bandwidth: jax.Array
    latency: jax.Array
    online: jax.Array
    online_count: jax.Array
    period: float = flax.struct.field(pytree_node=False, default=math.inf)


def draw_profile(system: SystemModel, num_clients: int, key: jax.Array) -> Profile:
    """The devices of `num_clients` clients as `system` describes them (drawn with `key`,
    or the trace's)."""
    speed_key, bandwidth_key, phase_key = jax.random.split(key, 3)
    availability = system.availability
    if system.trace is not None:
        period = availability.period if availability.kind == "trace" else None
        trace = read_trace(system.trace, num_clients, period)
        speed = jnp.asarray(trace.speed, jnp.float32)
        bandwidth = jnp.asarray(trace.bandwidth, jnp.float32)
        latency = jnp.asarray(trace.latency, jnp.float32)
        if availability.kind == "trace":
            return Profile(speed, bandwidth, latency, jnp.asarray(trace.online, jnp.float32),
                           jnp.asarray(trace.online_count, jnp.int32), availability.period)
    else:
        speed = (system.speeds or Distribution("constant", (1.0,))).draw(speed_key,
                                                                        num_clients)
        bandwidth = jnp.full((num_clients,), jnp.inf, jnp.float32) \
            if system.bandwidth is None else system.bandwidth.draw(bandwidth_key, num_clients)
        latency = jnp.full((num_clients,), system.latency, jnp.float32)
    if availability.kind == "diurnal" and availability.on_fraction < 1:
        online, count = diurnal_intervals(phase_key, num_clients, availability.period,
                                          availability.on_fraction)
        return Profile(speed, bandwidth, latency, online, count, availability.period)
    none = jnp.zeros((num_clients, 1, 2), jnp.float32)
    return Profile(speed, bandwidth, latency, none, jnp.zeros((num_clients,), jnp.int32))


def diurnal_intervals(key: jax.Array, num_clients: int, period: float, on_fraction: float):
    """Each client online for ``on_fraction * period`` seconds of every period from a phase
    drawn uniformly: as two intervals of the cycle (the second holds what wraps past its
    end, empty when nothing does); ``(online [C, 2, 2], count [C])``."""
    start = jax.random.uniform(key, (num_clients,), jnp.float32) * period
    end = start + on_fraction * period
    first = jnp.stack([start, jnp.minimum(end, period)], axis=1)
    wrapped = jnp.stack([jnp.zeros_like(start), jnp.maximum(end - period, 0.0)], axis=1)
    return jnp.stack([first, wrapped], axis=1), jnp.full((num_clients,), 2, jnp.int32)


def model_megabytes(params) -> float:
    """The size of a message: the model's parameters as float32, in megabytes (10^6 B)."""
    return 4.0 * sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params)) / 1e6


def _real(profile: Profile, clients: jax.Array):
    """The clients' intervals [S, J, 2] and which are real [S, J]."""
    intervals = profile.online[clients]
    count = profile.online_count[clients]
    real = jnp.arange(intervals.shape[1])[None, :] < count[:, None]
    return intervals, real, count


def online_at(profile: Profile, clients: jax.Array, time) -> jax.Array:
    """[S] bool: whether each client is online at simulated time `time`."""
    if math.isinf(profile.period):
        return jnp.ones(clients.shape, bool)
    intervals, real, count = _real(profile, clients)
    phase = jnp.mod(time, profile.period)
    inside = real & (intervals[..., 0] <= phase) & (phase < intervals[..., 1])
    return (count == 0) | jnp.any(inside, axis=1)


def online_until(profile: Profile, clients: jax.Array, time) -> jax.Array:
    """[S] float32: when each client's current online stretch ends (inf: never; `time`
    itself when it is offline). A stretch that reaches the cycle's end goes on in an
    interval that starts at 0 (a diurnal window that wraps)."""
    if math.isinf(profile.period):
        return jnp.full(clients.shape, jnp.inf, jnp.float32)
    intervals, real, count = _real(profile, clients)
    period = profile.period
    phase = jnp.mod(time, period)
    base = time - phase
    inside = real & (intervals[..., 0] <= phase) & (phase < intervals[..., 1])
    end = _stretch_end(intervals, real,
                       jnp.max(jnp.where(inside, intervals[..., 1], -jnp.inf), axis=1))
    from_zero = _stretch_end(intervals, real, jnp.zeros_like(end))
    end = jnp.where(end >= period, period + jnp.minimum(from_zero, period), end)
    until = jnp.where(jnp.isfinite(end), base + end, time)
    always = (count == 0) | (end >= 2 * period)
    return jnp.where(always, jnp.inf, until).astype(jnp.float32)


def _stretch_end(intervals: jax.Array, real: jax.Array, end: jax.Array) -> jax.Array:
    """[S] the end of the online stretch that reaches `end`, through intervals that touch
    or overlap it (at most J of them follow one another)."""
    for _ in range(intervals.shape[1]):
        joined = real & (intervals[..., 0] <= end[:, None])
        end = jnp.maximum(end, jnp.max(jnp.where(joined, intervals[..., 1], -jnp.inf), axis=1))
    return end


def next_online(profile: Profile, clients: jax.Array, time) -> jax.Array:
    """[S] float32: the earliest time >= `time` at which each client is online."""
    if math.isinf(profile.period):
        return jnp.full(clients.shape, time, jnp.float32)
    intervals, real, count = _real(profile, clients)
    period = profile.period
    phase = jnp.mod(time, period)
    base = time - phase
    starts = jnp.where(real, intervals[..., 0], jnp.inf)
    later = jnp.min(jnp.where(starts >= phase, starts, jnp.inf), axis=1)
    wrapped = jnp.min(starts, axis=1) + period
    start = base + jnp.where(jnp.isfinite(later), later, wrapped)
    now = online_at(profile, clients, time)
    return jnp.where(now | (count == 0), time, start).astype(jnp.float32)
