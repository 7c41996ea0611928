"""Host-side privacy accounting for client-level DP-FedAvg, built on Google's dp-accounting.

McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private Recurrent Language Models"
(ICLR 2018): each round samples clients and releases noised sums of their clipped updates, a
sampled Gaussian mechanism on the clients (`RoundMechanism`). A run composes one such mechanism
per round; this module gives the epsilon at a fixed delta after every round (`epsilons`,
`Accountant`), the rounds a budget allows (`rounds_within`), the noise multiplier a target
epsilon asks for (`solve_noise`) and the validators of the user's numbers.

Two accountants of dp-accounting (`make_accountant`): "rdp", Renyi DP (Mironov, "Renyi
Differential Privacy", CSF 2017; Mironov, Talwar and Zhang, "Renyi Differential Privacy of the
Sampled Gaussian Mechanism", 2019), and "pld", privacy loss distributions (Koskela, Jalko and
Honkela, AISTATS 2020; Doroshenko, Ghazi, Kamath, Kumar and Manurangsi, "Connect the Dots",
PETS 2022), tighter but without fixed-size sampling. Every round of a run is the same
mechanism, so its cost is computed once and each further round adds one more copy of it: an
RDP curve adds up order by order, a privacy loss distribution is convolved with one round's.
Fixed-size sampling is accounted under replace-one neighbours, where one client moves a sum by
up to twice its clip norm: dp-accounting is given z / 2 (`RoundMechanism.accounted_noise`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import logging
import math
import numbers
from typing import TYPE_CHECKING, Optional

import numpy

from mcfl.errors import ConfigError, choice_error

if TYPE_CHECKING:  # (annotations only: the library is imported at its first use, `_library`)
    import dp_accounting
    from dp_accounting import NeighboringRelation as Relation

SAMPLINGS = ("poisson", "fixed")
ACCOUNTANTS = ("rdp", "pld")


@functools.cache
def _library():
    """dp-accounting, imported at its first use: its import brings scipy.signal and
    scipy.stats, 0.85 s of every `mcfl` command's start on the project's 2-core machine, which
    runs without DP never need."""
    import dp_accounting
    from dp_accounting import pld, rdp  # noqa: F401 (the submodules the accountants are in)
    from dp_accounting.rdp import rdp_privacy_accountant  # noqa: F401

    return dp_accounting


@functools.cache
def _rdp_orders() -> tuple:
    """dp-accounting's default RDP orders, which the RDP curves below are read against."""
    return tuple(_library().rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS)


def __getattr__(name: str):
    # `Relation` and `RDP_ORDERS` as module attributes, without importing dp-accounting with
    # this module.
    if name == "Relation":
        return _library().NeighboringRelation
    if name == "RDP_ORDERS":
        return _rdp_orders()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The PLD grid step (of the privacy loss). Measured on this project's 2-core machine for
# q = 0.1, z = 1.1, delta 1e-5, every round's epsilon composed one round at a time: 1e-3 takes
# 0.9 s for 100 rounds and 17 s for 1000, 1e-4 takes 7 s for 100 rounds; the epsilons differ by
# under 1e-5 relative (5.91268 against 5.91265 after 100 rounds; the grid is pessimistic, so the
# coarser grid never reports less).
PLD_DISCRETIZATION = 1e-3
# solve_noise searches z in this range, to a relative tolerance of SOLVE_TOLERANCE.
NOISE_RANGE = (1e-2, 1e3)
SOLVE_TOLERANCE = 1e-3

_NEIGHBOURS = {"ADD_OR_REMOVE_ONE": "add-or-remove-one neighbours",
               "REPLACE_ONE": "replace-one neighbours"}


def _neighbours_in_words(relation) -> str:
    """A dp-accounting ``NeighboringRelation`` in words."""
    return _NEIGHBOURS.get(getattr(relation, "name", None), str(relation))


def _dp_accounting_version() -> str:
    try:
        return importlib.metadata.version("dp-accounting")
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


# ----------------------------------------------------------------------------- validators


def _real(value, what: str, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{what} {value!r} is not a number; allowed: {allowed}")
    return float(value)


def _count(value, what: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ConfigError(f"{what} {value!r} is not allowed; allowed: an integer >= {least}")
    return int(value)


def check_delta(delta) -> float:
    """`delta` as a float; ConfigError unless a real number in the open interval (0, 1)."""
    allowed = "a real number in the open interval (0, 1)"
    value = _real(delta, "delta", allowed)
    if not 0.0 < value < 1.0:  # NaN fails too
        raise ConfigError(f"delta {delta!r} is not allowed; allowed: {allowed}")
    return value


def check_noise(noise_multiplier) -> float:
    """A noise multiplier z as a float; ConfigError unless finite and >= 0 (0: no noise)."""
    allowed = "a finite real number >= 0"
    value = _real(noise_multiplier, "noise multiplier", allowed)
    if not (math.isfinite(value) and value >= 0.0):
        raise ConfigError(f"noise multiplier {noise_multiplier!r} is not allowed; "
                          f"allowed: {allowed}")
    return value


def check_epsilon(epsilon) -> float:
    """An epsilon (a target or a budget) as a float; ConfigError unless > 0 (inf allowed)."""
    allowed = "a real number > 0"
    value = _real(epsilon, "epsilon", allowed)
    if not value > 0.0:  # NaN fails too
        raise ConfigError(f"epsilon {epsilon!r} is not allowed; allowed: {allowed}")
    return value


def _check_accountant(name) -> str:
    if name not in ACCOUNTANTS:
        raise choice_error("accountant", name, ACCOUNTANTS)
    return name


# ----------------------------------------------------------------------------- mechanism


@dataclasses.dataclass(frozen=True)
class RoundMechanism:
    """What one round releases about the clients: a sampled Gaussian mechanism.

    `sampling`: "poisson", each of `population` clients joins with probability
    q = sample_size / population (McMahan et al. 2018, Algorithm 1), or "fixed", exactly
    `sample_size` distinct clients uniformly at random. `noise_multiplier` z: the Gaussian
    noise's std over the L2 bound of one client's contribution (the clip norm C), the same z
    as ``--dp-noise``."""

    sampling: str
    population: int
    sample_size: int
    noise_multiplier: float

    def __post_init__(self):
        if self.sampling not in SAMPLINGS:
            raise choice_error("sampling", self.sampling, SAMPLINGS)
        population = _count(self.population, "population", 1)
        sample_size = _count(self.sample_size, "sample size", 1)
        if sample_size > population:
            raise ConfigError(f"sample size {sample_size} is not allowed; allowed: an integer "
                              f"from 1 to the population, {population}")
        object.__setattr__(self, "population", population)
        object.__setattr__(self, "sample_size", sample_size)
        object.__setattr__(self, "noise_multiplier", check_noise(self.noise_multiplier))

    @property
    def sampling_rate(self) -> float:
        """q: the chance that a given client takes part in a round."""
        return self.sample_size / self.population

    @property
    def accounted_noise(self) -> float:
        """The noise multiplier dp-accounting is given: z under add-or-remove-one neighbours;
        z / 2 under replace-one, where one client's change moves a sum by up to 2 C (a
        replacement is a removal and an addition; jax_privacy's ``sensitivity(REPLACE_ONE)``
        is twice the clip norm) while dp-accounting's Gaussian is relative to that
        sensitivity (Wang, Balle and Kasiviswanathan, AISTATS 2019, Theorem 27)."""
        if neighbouring(self).name == "REPLACE_ONE":
            return self.noise_multiplier / 2.0
        return self.noise_multiplier

    def event(self) -> dp_accounting.DpEvent:
        """One round as a dp-accounting event: ``PoissonSampledDpEvent(q, GaussianDpEvent)``
        or ``SampledWithoutReplacementDpEvent(N, S, GaussianDpEvent)``, the plain Gaussian
        when every client takes part (q = 1), and ``NonPrivateDpEvent`` when z = 0 (the sums
        are released in the clear)."""
        dp_accounting = _library()
        if self.noise_multiplier == 0.0:
            return dp_accounting.NonPrivateDpEvent()
        gaussian = dp_accounting.GaussianDpEvent(self.accounted_noise)
        if self.sample_size == self.population:
            return gaussian
        if self.sampling == "poisson":
            return dp_accounting.PoissonSampledDpEvent(self.sampling_rate, gaussian)
        return dp_accounting.SampledWithoutReplacementDpEvent(self.population,
                                                              self.sample_size, gaussian)

    def describe(self) -> str:
        """The mechanism in words, e.g. "Poisson-sampled Gaussian, q = 0.1, z = 1.1"."""
        if self.sample_size == self.population:
            text = f"Gaussian on all {self.population} clients, z = {self.noise_multiplier:g}"
        elif self.sampling == "poisson":
            text = (f"Poisson-sampled Gaussian, q = {self.sampling_rate:g}, "
                    f"z = {self.noise_multiplier:g}")
        else:
            text = (f"Gaussian on {self.sample_size} of {self.population} clients sampled "
                    f"without replacement, z = {self.noise_multiplier:g}")
        if neighbouring(self).name == "REPLACE_ONE":
            text += f" (z / 2 = {self.accounted_noise:g} on the replace-one sensitivity 2 C)"
        return text


def neighbouring(mechanism: RoundMechanism) -> Relation:
    """The neighbouring relation the accounting uses: ADD_OR_REMOVE_ONE for Poisson sampling
    (McMahan et al. 2018's client-level DP), REPLACE_ONE for fixed-size sampling, the only
    relation under which dp-accounting's RDP accountant takes sampling without replacement
    (the population N is then public)."""
    relation = _library().NeighboringRelation
    if mechanism.sampling == "poisson":
        return relation.ADD_OR_REMOVE_ONE
    return relation.REPLACE_ONE


def effective_noise(*noise_multipliers: float) -> float:
    """The one Gaussian mechanism that Gaussian queries released together on the same clients
    amount to: z_eff = (sum_i z_i^-2)^-1/2, each z_i relative to its own query's sensitivity
    (e.g. a cluster's update sum with noise z and its client count with noise z: z / sqrt(2)).
    Dong, Roth and Su, "Gaussian Differential Privacy" (JRSS B, 2022), Corollary 3.3: mu-GDP
    composes as sqrt(sum mu_i^2), and the Gaussian mechanism with multiplier z is exactly
    (1 / z)-GDP. Any z_i = 0 releases a query in the clear: 0."""
    if not noise_multipliers:
        raise ConfigError("effective_noise needs at least one noise multiplier; allowed: one "
                          "or more finite real numbers >= 0")
    checked = [check_noise(z) for z in noise_multipliers]
    if min(checked) == 0.0:
        return 0.0
    return 1.0 / math.sqrt(math.fsum(z ** -2 for z in checked))


def default_delta(population: int) -> float:
    """1 / N^1.1 for N clients. An (epsilon, delta) guarantee allows a total failure with
    probability delta: releasing each client's data in the clear with probability delta is
    (0, delta)-DP, yet exposes delta N clients on average. delta must therefore be well below
    1 / N (Dwork and Roth, "The Algorithmic Foundations of Differential Privacy", 2014,
    Sec. 2.3); the power 1.1 keeps it below 1 / N by a factor N^0.1 at any N."""
    return float(_count(population, "population", 1)) ** -1.1


# ----------------------------------------------------------------------------- accountants


def make_accountant(name: str, relation: Relation,
                    event: Optional[dp_accounting.DpEvent] = None
                    ) -> dp_accounting.PrivacyAccountant:
    """A fresh dp-accounting accountant: "rdp", ``rdp.RdpAccountant`` (its default orders,
    `RDP_ORDERS`), or "pld", ``pld.PLDAccountant`` (grid `PLD_DISCRETIZATION`). With `event`,
    ConfigError when that accountant cannot compose it, naming the accountant that can."""
    dp_accounting = _library()
    if _check_accountant(name) == "rdp":
        accountant = dp_accounting.rdp.RdpAccountant(_rdp_orders(), relation)
    else:
        accountant = dp_accounting.pld.PLDAccountant(
            relation, value_discretization_interval=PLD_DISCRETIZATION)
    if event is not None and not accountant.supports(event):
        instead = [other for other in ACCOUNTANTS if other != name
                   and make_accountant(other, relation).supports(event)]
        what = ("fixed-size sampling (sampling without replacement)"
                if _samples_without_replacement(event) else f"the event {event}")
        advice = (f"use accountant {instead[0]!r}" if instead
                  else f"none of {', '.join(ACCOUNTANTS)} can")
        raise ConfigError(f"accountant {name!r} (dp-accounting {_dp_accounting_version()}) "
                          f"cannot account for {what} with {_neighbours_in_words(relation)}"
                          f"; {advice}")
    return accountant


def _samples_without_replacement(event: dp_accounting.DpEvent) -> bool:
    dp_accounting = _library()
    if isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent):
        return True
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return _samples_without_replacement(event.event)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return any(_samples_without_replacement(e) for e in event.events)
    return False


@contextlib.contextmanager
def _skipped_orders_unlogged():
    """dp-accounting warns (through absl's logger) of each RDP order whose series did not
    converge and is left out of the minimum; the epsilon is still a valid bound, and a run's
    terminal is no place for it: the logger is raised to errors for one computation."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class _RdpRounds:
    """Before-event plus r rounds under RDP: RDP composes by adding curves order by order
    (Mironov 2017, Proposition 1), so one round's curve is computed once and added per round;
    epsilon from the curve by dp-accounting's conversion (``compute_epsilon``)."""

    def __init__(self, round_event, before, relation):
        self._per_round = self._curve(round_event, relation)
        self._total = (self._curve(before, relation) if before is not None
                       else numpy.zeros(len(_rdp_orders())))

    @staticmethod
    def _curve(event, relation) -> numpy.ndarray:
        with _skipped_orders_unlogged():
            accountant = make_accountant("rdp", relation, event).compose(event)
        # The curve is the accountant's state (``_rdp`` in dp-accounting 0.6, not public):
        # read once, it spares recomputing one round's curve at every round (0.1-0.4 s each).
        return numpy.array(accountant._rdp, dtype=numpy.float64)

    def add_rounds(self, count: int) -> None:
        self._total = self._total + count * self._per_round

    def curve(self) -> numpy.ndarray:
        """The RDP curve so far, at `RDP_ORDERS`."""
        return self._total.copy()

    def epsilon(self, delta: float) -> float:
        return float(_library().rdp.rdp_privacy_accountant.compute_epsilon(
            _rdp_orders(), self._total, delta)[0])


class _PldRounds:
    """Before-event plus r rounds as one privacy loss distribution: each further round
    convolves it with one round's distribution, built once (dp-accounting's
    ``PrivacyLossDistribution.compose``)."""

    def __init__(self, round_event, before, relation):
        self._per_round, self._in_clear = self._distribution(round_event, relation)
        self._total, before_in_clear = (self._distribution(before, relation)
                                        if before is not None else (None, False))
        self._clear_so_far = before_in_clear

    @staticmethod
    def _distribution(event, relation):
        accountant = make_accountant("pld", relation, event).compose(event)
        # The distribution and whether a non-private event was composed are the accountant's
        # state (dp-accounting 0.6, not public): read once, they spare rebuilding one round's
        # distribution at every round.
        return accountant._pld, accountant._contains_non_dp_event

    def add_rounds(self, count: int) -> None:
        self._clear_so_far = self._clear_so_far or self._in_clear
        block = self._per_round if count == 1 else self._per_round.self_compose(count)
        self._total = block if self._total is None else self._total.compose(block)

    def epsilon(self, delta: float) -> float:
        if self._clear_so_far:
            return math.inf
        if self._total is None:
            return 0.0
        return float(self._total.get_epsilon_for_delta(delta))


_ROUNDS = {"rdp": _RdpRounds, "pld": _PldRounds}


class Accountant:
    """The run's accountant on the host: composes one round at a time; epsilon after each.

    `before`: an event composed first (a private initialisation's cost), under the same
    neighbouring relation (`neighbouring`); `rounds_done`: a resumed run's rounds, composed at
    construction, so that its accounting continues where the interrupted run stopped."""

    def __init__(self, mechanism: RoundMechanism, delta: float, accountant: str = "rdp",
                 before: Optional[dp_accounting.DpEvent] = None, rounds_done: int = 0):
        self._mechanism = mechanism
        self._delta = check_delta(delta)
        self._name = _check_accountant(accountant)
        self._before = before
        self._rounds_so_far = _ROUNDS[self._name](mechanism.event(), before,
                                                  neighbouring(mechanism))
        self._rounds = 0
        self._epsilon = self._rounds_so_far.epsilon(self._delta)
        self.step(_count(rounds_done, "rounds done", 0))

    def step(self, count: int = 1) -> float:
        """Compose `count` more rounds; the epsilon at delta after them."""
        if _count(count, "round count", 0):
            self._rounds_so_far.add_rounds(count)
            self._rounds += count
            self._epsilon = self._rounds_so_far.epsilon(self._delta)
        return self._epsilon

    @property
    def epsilon(self) -> float:
        """Epsilon at delta after the rounds composed so far (and `before`)."""
        return self._epsilon

    @property
    def rounds(self) -> int:
        return self._rounds

    @property
    def name(self) -> str:
        """"rdp" or "pld"."""
        return self._name

    @property
    def delta(self) -> float:
        return self._delta

    def describe(self) -> str:
        """One line (`describe`)."""
        return describe(self._mechanism, self._delta, self._name, self._before)


# ----------------------------------------------------------------------------- run-level


def describe(mechanism: RoundMechanism, delta: float, accountant: str = "rdp",
             before: Optional[dp_accounting.DpEvent] = None) -> str:
    """One line saying what the accountant composes, e.g. "RDP accountant (dp-accounting
    0.6.0), Poisson-sampled Gaussian, q = 0.1, z = 1.1, add-or-remove-one neighbours, delta =
    1e-05" (composing nothing: a run's summary says it without accounting again)."""
    library = f"dp-accounting {_dp_accounting_version()}"
    kind = (f"RDP accountant ({library})" if _check_accountant(accountant) == "rdp"
            else f"PLD accountant ({library}, grid {PLD_DISCRETIZATION:g})")
    parts = [kind, mechanism.describe(), _neighbours_in_words(neighbouring(mechanism)),
             f"delta = {check_delta(delta):g}"]
    if before is not None:
        parts.append("after a private initialisation")
    return ", ".join(parts)


def epsilons(mechanism: RoundMechanism, rounds: int, delta: float, accountant: str = "rdp",
             before: Optional[dp_accounting.DpEvent] = None) -> numpy.ndarray:
    """[rounds] float64: epsilon at `delta` after rounds 1..rounds, composed in one pass (one
    round added at a time); `before` is included in every entry. inf everywhere when z = 0."""
    rounds = _count(rounds, "rounds", 0)
    running = Accountant(mechanism, delta, accountant, before)
    return numpy.array([running.step() for _ in range(rounds)], dtype=numpy.float64)


def rounds_within(mechanism: RoundMechanism, budget_epsilon: float, delta: float, rounds: int,
                  accountant: str = "rdp",
                  before: Optional[dp_accounting.DpEvent] = None) -> int:
    """The largest r <= `rounds` whose epsilon stays within `budget_epsilon` (epsilon grows
    with r; 0 when the first round alone exceeds it). Stops composing at the first round over
    the budget."""
    budget = check_epsilon(budget_epsilon)
    rounds = _count(rounds, "rounds", 0)
    running = Accountant(mechanism, delta, accountant, before)
    for done in range(rounds):
        if running.step() > budget:
            return done
    return rounds


def solve_noise(target_epsilon: float, rounds: int, delta: float, sampling: str,
                population: int, sample_size: int, accountant: str = "rdp",
                before: Optional[dp_accounting.DpEvent] = None) -> float:
    """The smallest noise multiplier z in [1e-2, 1e3] whose epsilon after `rounds` rounds is
    at most `target_epsilon`, to a relative tolerance of 1e-3: dp-accounting's
    ``calibrate_dp_mechanism`` (Brent's method) on log z. ConfigError when even z = 1e3
    spends more than the target. For "pld" the search starts from RDP's z (the comment in
    the body says why)."""
    target = check_epsilon(target_epsilon)
    delta = check_delta(delta)
    rounds = _count(rounds, "rounds", 1)
    _check_accountant(accountant)
    relation = neighbouring(RoundMechanism(sampling, population, sample_size, 1.0))
    dp_accounting = _library()

    def run_event(log_noise: float) -> dp_accounting.DpEvent:
        mechanism = RoundMechanism(sampling, population, sample_size, math.exp(log_noise))
        event = dp_accounting.SelfComposedDpEvent(mechanism.event(), rounds)
        return event if before is None else dp_accounting.ComposedDpEvent([before, event])

    def epsilon_at(log_noise: float) -> float:
        event = run_event(log_noise)
        with _skipped_orders_unlogged():
            return make_accountant(accountant, relation, event).compose(event).get_epsilon(
                delta)

    low, high = (math.log(z) for z in NOISE_RANGE)
    at_most_noise = epsilon_at(high)
    if at_most_noise > target:
        raise ConfigError(f"target epsilon {target:g} is out of reach: even noise multiplier "
                          f"{NOISE_RANGE[1]:g} spends epsilon {at_most_noise:.4g} over {rounds} "
                          f"rounds; allowed: a target above {at_most_noise:.4g}")
    if accountant == "pld":
        # A PLD at small z spans a huge range of privacy losses (z = 1e-2, q = 0.1, 1000
        # rounds ran out of this machine's memory): PLD's z is bracketed near RDP's, which
        # is cheap at any z and in practice no smaller (RDP's epsilon is the looser bound).
        try:
            rdp_noise = solve_noise(target, rounds, delta, sampling, population, sample_size,
                                    "rdp", before)
        except ConfigError:  # beyond RDP's reach, within PLD's
            rdp_noise = NOISE_RANGE[1]
        if rdp_noise == NOISE_RANGE[0]:  # RDP's epsilon is a guarantee too
            return rdp_noise
        bracket = _bracket_near(epsilon_at, target, math.log(rdp_noise), low, high)
        if bracket is None:
            return NOISE_RANGE[0]
        low, high = bracket
    elif epsilon_at(low) <= target:
        return NOISE_RANGE[0]
    log_noise = dp_accounting.calibrate_dp_mechanism(
        lambda: make_accountant(accountant, relation), run_event, target, delta,
        dp_accounting.ExplicitBracketInterval(low, high), tol=math.log1p(SOLVE_TOLERANCE))
    return math.exp(log_noise)


def _bracket_near(epsilon_at, target: float, guess: float, lowest: float, highest: float,
                  step: float = math.log(1.25)) -> Optional[tuple[float, float]]:
    """(low, high) in log z around `guess`, steps of 25%, with epsilon_at(low) > target >=
    epsilon_at(high) (epsilon_at(highest) <= target is known); None when even `lowest` is
    within the target."""
    high = guess
    while high < highest and epsilon_at(high) > target:
        high = min(high + step, highest)
    low = high
    while True:
        if low <= lowest:
            return None
        low, high = max(low - step, lowest), low
        if epsilon_at(low) > target:
            return low, high
