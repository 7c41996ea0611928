"""A run's privacy, settled before it starts: the mechanism (C, z, the denominator), delta, the
accountant, the epsilon after every round, and the rounds a budget allows.

`privacy_plan(spec, population, expected)` turns the resolved ``dp_*`` settings
(`PrivacySpec`) into the plan once the dataset's client count N is known: delta defaults to
1 / N^1.1, z is solved from ``dp_epsilon`` when that is given, and each round is accounted as
one sampled Gaussian mechanism whose noise multiplier composes everything the round releases
(`mechanism.Mechanism.released_noise`). The epsilon after round r depends on r alone (not on
the data), so the whole curve is computed on the host before the first round; a resumed run
recomputes the same numbers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from mcfl.errors import ConfigError
from mcfl.privacy import accounting, support
from mcfl.privacy.mechanism import DPSettings, Mechanism, gaussian_mechanism
from mcfl.transforms import MessageTransform

# Canary directions come from the run's seed plus this (never the seed of anything else).
CANARY_SEED_OFFSET = 0x63616E61


@dataclasses.dataclass(frozen=True)
class PrivacyPlan:
    """The privacy of a run (module docstring). `rounds`: the rounds it runs (fewer than the
    config's when ``dp_epsilon_budget`` stops it early)."""

    mechanism: Mechanism
    sampling: str  # "poisson" | "fixed"
    population: int
    expected: int
    delta: float
    accountant: str
    rounds: int
    budget: Optional[float] = None
    # the noise multiplier of a private initialisation on all clients, composed before the
    # rounds (DP-FeSEM's k-means), None without one
    before_noise: Optional[float] = None

    def transform(self) -> MessageTransform:
        return gaussian_mechanism(self.mechanism)

    def settings(self, values: Mapping[str, Any]) -> DPSettings:
        """The mechanism's traced numbers: a sweep member's ``dp_clip`` / ``dp_noise`` from
        `values`, else the plan's."""
        return DPSettings(values.get("dp_clip", self.mechanism.clip),
                          values.get("dp_noise", self.mechanism.noise))

    def round_mechanism(self, noise: Optional[float] = None) -> accounting.RoundMechanism:
        """What the accountant composes each round (with update-sum multiplier `noise`)."""
        return accounting.RoundMechanism(self.sampling, self.population, self.expected,
                                         self.mechanism.released_noise(noise))

    def before(self):
        """The initialisation's event (one Gaussian mechanism on all N clients), or None."""
        return _event(self.sampling, self.population, self.before_noise)

    def epsilons(self, rounds: Optional[int] = None,
                 noise: Optional[float] = None) -> np.ndarray:
        """[rounds] epsilon at delta after each round (a private initialisation's cost
        included)."""
        return accounting.epsilons(self.round_mechanism(noise), rounds or self.rounds,
                                   self.delta, self.accountant, self.before())

    def describe(self, noise: Optional[float] = None) -> str:
        text = accounting.describe(self.round_mechanism(noise), self.delta, self.accountant)
        if self.before_noise is not None:
            text += (f"; after a private initialisation on all clients, one Gaussian "
                     f"mechanism with z = {self.before_noise:.4g}")
        return text

    def summary(self, spent: float, noise: Optional[float] = None) -> dict[str, Any]:
        """What a run's summary.json says of its privacy, having spent epsilon `spent` (its
        `epsilons` at the rounds done: the caller has them)."""
        return {"dp_epsilon": float(spent), "dp_delta": self.delta,
                "dp_accountant": self.accountant,
                "dp_accounting": self.describe(noise),
                "dp_noise": float(self.mechanism.noise if noise is None else noise),
                "dp_noise_released": self.mechanism.released_noise(noise),
                "dp_clip": float(self.mechanism.clip),
                "dp_sampling": self.sampling, "dp_sampling_rate": self.expected / self.population,
                "dp_epsilon_budget": self.budget, "dp_rounds_within_budget": self.rounds}


@dataclasses.dataclass(frozen=True)
class PrivacySpec:
    """Client-level DP as a run's settings resolve it, before its population is known: the
    clipping norm `clip`; the noise multiplier `noise` or the `epsilon` it is solved for (one
    of them); `delta` (None: 1 / N^1.1 once N is known); the `budget` that stops the run
    early; adaptive clipping's quantile; per-layer clipping; the accountant; canary clients;
    and what the run fixes around it: the sampling the accountant assumes ("poisson" |
    "fixed"), the algorithm's coverage (`support.Covered`), whether its rounds release
    per-cluster counts (K > 1), the rounds, the canaries' seed and the noise of a private
    initialisation (DP-FeSEM's k-means; None without one)."""

    clip: float
    noise: Optional[float]
    epsilon: Optional[float]
    delta: Optional[float]
    budget: Optional[float]
    adaptive_quantile: Optional[float]
    clip_per_layer: bool
    accountant: str
    canaries: int
    sampling: str
    covered: support.Covered
    clustered: bool
    rounds: int
    canary_seed: int
    before_noise: Optional[float] = None

    def describe(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["covered"] = self.covered._asdict()
        return out


def privacy_plan(spec: Optional[PrivacySpec], population: int,
                 expected: int) -> Optional[PrivacyPlan]:
    """The plan of `spec` on `population` clients, `expected` a round (None without DP)."""
    if spec is None:
        return None
    delta = spec.delta if spec.delta is not None else accounting.default_delta(population)
    accounting.check_delta(delta)
    sampling = spec.sampling
    mechanism = Mechanism(spec.clip, 0.0 if spec.noise is None else spec.noise,
                          float(expected), spec.covered.sums, spec.clustered,
                          spec.clip_per_layer, spec.adaptive_quantile, spec.canaries,
                          spec.canary_seed, expected / population)
    before = spec.before_noise
    if spec.epsilon is not None:
        released = accounting.solve_noise(spec.epsilon, spec.rounds, delta, sampling,
                                          population, expected, spec.accountant,
                                          _event(sampling, population, before))
        mechanism = dataclasses.replace(mechanism, noise=mechanism.noise_for(released))
    plan = PrivacyPlan(mechanism, sampling, population, expected, delta, spec.accountant,
                       spec.rounds, spec.budget, before)
    if spec.budget is not None:
        within = accounting.rounds_within(plan.round_mechanism(), spec.budget, delta,
                                          spec.rounds, spec.accountant, plan.before())
        if within == 0:
            first = float(plan.epsilons(1)[0])
            raise ConfigError(f"--dp-epsilon-budget {spec.budget:g} is spent by the first "
                              f"round alone (epsilon {first:.4g}); allowed: a budget above "
                              f"{first:.4g}, or more noise")
        plan = dataclasses.replace(plan, rounds=within)
    return plan


def _event(sampling: str, population: int, noise: Optional[float]):
    """A Gaussian mechanism with multiplier `noise` on all clients (None: None)."""
    if noise is None:
        return None
    return accounting.RoundMechanism(sampling, population, population, noise).event()
