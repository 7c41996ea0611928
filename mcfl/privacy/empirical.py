"""One-shot empirical privacy estimate with random canary clients.

The statistics of Andrew, Kairouz, Oh, Oprea, McMahan and Suriyakumar, "One-shot Empirical
Privacy Estimation for Federated Learning" (ICLR 2024, arXiv:2302.03098). A DP-FedAvg run
takes in k canary clients, each of which sends, every round it is sampled, a fixed random unit
direction scaled to the clipping norm. After training, the cosine between the model's total
change (final - initial, flattened) and each inserted direction is measured, and the same
cosine for k' fresh directions that were never inserted ("unseen" canaries). In d dimensions
an unseen direction's cosine is about N(0, 1/d) (the paper's Section 4; exactly, a Beta-shaped
law on [-1, 1] with variance 1/d). The estimate fits one Gaussian to each sample and reports
the epsilon at `delta` of telling the two Gaussians apart: the (epsilon, delta) of a mechanism
whose output, the cosine, follows the unseen fit without the canary and the inserted fit with
it (the paper's estimate, Sections 3 and 4, with its Algorithms).

This module is the statistics only: `canary_directions` draws the directions, `cosines`
measures them, `gaussian_pair_epsilon` is the epsilon between two Gaussians and
`estimate_epsilon` the estimate from the two samples of cosines.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from mcfl.errors import ConfigError

# The two samples' fits need at least this many cosines each (a standard deviation needs two).
MINIMUM_CANARIES = 2


def canary_directions(key: jax.Array, count: int, dimension: int) -> jax.Array:
    """`count` random unit vectors in `dimension` dimensions, [count, dimension] float32.

    Each row is a standard normal vector divided by its norm, hence uniform on the sphere: the
    random canaries of Andrew et al. (2024), Section 4, whose cosine with any fixed vector
    has mean 0 and variance 1/dimension.
    """
    if count < 0 or dimension < 1:
        raise ConfigError(
            f"canary directions need count >= 0 and dimension >= 1; got count {count}, "
            f"dimension {dimension}")
    draws = jax.random.normal(key, (count, dimension), dtype=jnp.float32)
    return draws / jnp.linalg.norm(draws, axis=1, keepdims=True)


def cosines(change: jax.Array, directions: jax.Array) -> jax.Array:
    """[count] cosine between the flat vector `change` [d] and each row of `directions`
    [count, d]: <change, c_i> / (|change| |c_i|), the test statistic of Andrew et al. (2024),
    Section 4; 0 for every row where `change` (or the row) is all zero.
    """
    change = jnp.ravel(jnp.asarray(change, dtype=jnp.float32))
    directions = jnp.asarray(directions, dtype=jnp.float32)
    if directions.ndim != 2 or directions.shape[1] != change.shape[0]:
        raise ConfigError(
            f"cosines need directions of shape [count, {change.shape[0]}] for a change of "
            f"{change.shape[0]} values; got directions of shape {tuple(directions.shape)}")
    norms = jnp.linalg.norm(directions, axis=1) * jnp.linalg.norm(change)
    dots = directions @ change
    return jnp.where(norms > 0, dots / jnp.where(norms > 0, norms, 1.0), 0.0)


def _log_mass(lower: float, upper: float, mean: float, std: float) -> float:
    """log Pr[lower < X < upper] for X ~ N(mean, std^2), accurate far in either tail (through
    log Phi of the standardised ends, on whichever side of the mean the interval lies)."""
    from scipy import stats  # (imported here: scipy.stats is 0.4 s of the CLI's start)

    a, b = (lower - mean) / std, (upper - mean) / std
    if not a < b:
        return -math.inf
    if a > 0:  # both ends above the mean: the difference of two upper tails
        top, rest = stats.norm.logsf(a), stats.norm.logsf(b)
    else:  # use lower tails: Phi(b) - Phi(a)
        top, rest = stats.norm.logcdf(b), stats.norm.logcdf(a)
    if rest == -math.inf:
        return float(top)
    return float(top + math.log1p(-math.exp(min(rest - top, 0.0))))


def _privacy_region(mu_p: float, s_p: float, mu_q: float, s_q: float, epsilon: float):
    """The intervals where the privacy loss log p(x)/q(x) of P = N(mu_p, s_p^2) against
    Q = N(mu_q, s_q^2) exceeds `epsilon`, as (lower, upper) pairs.

    log p(x) - log q(x) = a x^2 + b x + c with a = 1/(2 s_q^2) - 1/(2 s_p^2),
    b = mu_p/s_p^2 - mu_q/s_q^2, c = mu_q^2/(2 s_q^2) - mu_p^2/(2 s_p^2) + log(s_q/s_p): the
    region is where a x^2 + b x + (c - epsilon) > 0 (a half-line when a = 0, two tails when
    a > 0, one interval or nothing when a < 0).
    """
    a = 0.5 / s_q**2 - 0.5 / s_p**2
    b = mu_p / s_p**2 - mu_q / s_q**2
    c = 0.5 * mu_q**2 / s_q**2 - 0.5 * mu_p**2 / s_p**2 + math.log(s_q / s_p) - epsilon
    if a == 0:
        if b == 0:
            return [(-math.inf, math.inf)] if c > 0 else []
        root = -c / b
        return [(root, math.inf)] if b > 0 else [(-math.inf, root)]
    discriminant = b * b - 4 * a * c
    if discriminant <= 0:
        return [(-math.inf, math.inf)] if a > 0 else []
    spread = math.sqrt(discriminant)
    left, right = sorted(((-b - spread) / (2 * a), (-b + spread) / (2 * a)))
    if a > 0:
        return [(-math.inf, left), (right, math.inf)]
    return [(left, right)]


def _log_delta(mu_p: float, s_p: float, mu_q: float, s_q: float, epsilon: float) -> float:
    """log of the hockey-stick divergence delta(epsilon) = Pr_P[S] - e^epsilon Pr_Q[S], S the
    region where log p/q > epsilon: the smallest delta for which P is (epsilon, delta)-close to
    Q in this one direction (the privacy-loss form of (epsilon, delta)-DP; see Steinke 2022,
    "Composition of differential privacy & privacy amplification by subsampling"). -inf where
    it is 0."""
    region = _privacy_region(mu_p, s_p, mu_q, s_q, epsilon)
    if not region:
        return -math.inf
    log_p = float(np.logaddexp.reduce([_log_mass(lo, hi, mu_p, s_p) for lo, hi in region]))
    log_q = float(np.logaddexp.reduce([_log_mass(lo, hi, mu_q, s_q) for lo, hi in region]))
    if log_p == -math.inf:
        return -math.inf
    ratio = epsilon + log_q - log_p  # <= 0 in exact arithmetic, since p > e^eps q on S
    if ratio >= 0:
        return -math.inf
    return log_p + math.log1p(-math.exp(ratio))


def _one_way_epsilon(mu_p: float, s_p: float, mu_q: float, s_q: float, delta: float) -> float:
    """The smallest epsilon >= 0 with delta(epsilon) <= `delta` for P against Q: delta(epsilon)
    decreases in epsilon, so a bracket [lo, hi] is found by doubling and the crossing of
    log delta(epsilon) = log `delta` by Brent's method (scipy.optimize.brentq). inf beyond
    epsilon 1e6."""
    target = math.log(delta)

    def gap(epsilon: float) -> float:
        # Clipped below: delta(epsilon) reaches 0 where the loss is bounded (a < 0), and Brent's
        # method needs finite values; the clipped function still crosses zero at the same point.
        return max(_log_delta(mu_p, s_p, mu_q, s_q, epsilon), target - 100.0) - target

    if gap(0.0) <= 0:
        return 0.0
    low, high = 0.0, 1.0
    while gap(high) > 0:
        low, high = high, 2 * high
        if high > 1e6:
            return math.inf
    from scipy import optimize

    return float(optimize.brentq(gap, low, high, xtol=1e-12, rtol=1e-12))


def gaussian_pair_epsilon(
    mu_0: float, sigma_0: float, mu_1: float, sigma_1: float, delta: float
) -> float:
    """Epsilon at `delta` between N(mu_0, sigma_0^2) and N(mu_1, sigma_1^2): the smallest
    epsilon with both delta_{0||1}(epsilon) <= delta and delta_{1||0}(epsilon) <= delta, i.e. the
    larger of the two one-way epsilons (Andrew et al. 2024, the epsilon of two Gaussians that
    turns the fitted cosine distributions into the estimate).

    Method: delta_{P||Q}(epsilon) = Pr_P[L > epsilon] - e^epsilon Pr_Q[L > epsilon], with the
    privacy loss L(x) = log p(x)/q(x) a quadratic in x, so the region {L > epsilon} is a
    half-line or one or two intervals whose Gaussian masses are exact normal CDFs (in log space).
    delta_{P||Q} decreases in epsilon; the root of log delta_{P||Q}(epsilon) = log delta is
    bracketed by doubling and found with scipy's Brent method, in each direction.

    With sigma_0 = sigma_1 = sigma this is the Gaussian mechanism's epsilon for
    mu = |mu_1 - mu_0| / sigma, the root of Balle & Wang's (2018) analytic formula
    delta = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2).

    Returns 0 when the two distributions are equal (or within `delta` in total variation) and
    inf when a sigma is 0 and the distributions differ (a point mass against anything else is
    told apart with certainty).
    """
    if not 0 < delta < 1:
        raise ConfigError(f"delta must be in (0, 1); got {delta}")
    if sigma_0 < 0 or sigma_1 < 0 or not all(
            math.isfinite(v) for v in (mu_0, sigma_0, mu_1, sigma_1)):
        raise ConfigError(
            f"gaussian_pair_epsilon needs finite means and sigmas >= 0; got N({mu_0}, "
            f"{sigma_0}^2) and N({mu_1}, {sigma_1}^2)")
    if mu_0 == mu_1 and sigma_0 == sigma_1:
        return 0.0
    if sigma_0 == 0 or sigma_1 == 0:
        return math.inf
    return max(_one_way_epsilon(mu_0, sigma_0, mu_1, sigma_1, delta),
               _one_way_epsilon(mu_1, sigma_1, mu_0, sigma_0, delta))


@dataclasses.dataclass(frozen=True)
class EmpiricalEstimate:
    """The one-shot estimate and the two Gaussian fits it comes from (Andrew et al. 2024):
    `epsilon` at `delta` between N(unseen_mean, unseen_std^2) and
    N(inserted_mean, inserted_std^2), fitted to `inserted` and `unseen` canary cosines."""

    epsilon: float
    delta: float
    inserted_mean: float
    inserted_std: float
    unseen_mean: float
    unseen_std: float
    inserted: int
    unseen: int

    def to_dict(self) -> dict:
        """The fields as plain Python floats and ints, ready for JSON (epsilon may be inf)."""
        return {f.name: (int if f.type == "int" else float)(getattr(self, f.name))
                for f in dataclasses.fields(self)}


def _sample(values, name: str) -> np.ndarray:
    sample = np.asarray(values, dtype=np.float64).ravel()
    if not np.all(np.isfinite(sample)):
        raise ConfigError(f"the {name} canary cosines hold a NaN or inf value")
    return sample


def estimate_epsilon(inserted_cosines, unseen_cosines, delta: float) -> EmpiricalEstimate:
    """Andrew et al.'s (2024) one-shot epsilon estimate from the cosines of the inserted and of
    the unseen canaries.

    Each sample gets a Gaussian fit (its mean and its standard deviation with Bessel's
    correction, ddof=1): N(mu_0, s_0^2) for the unseen, N(mu_1, s_1^2) for the inserted, and the
    estimate is `gaussian_pair_epsilon(mu_0, s_0, mu_1, s_1, delta)`. The paper's null is the
    known law of an unseen cosine, N(0, 1/d) (its Section 4); the unseen canaries estimate the
    same law from the run itself (and, in high dimension, agree with it). For the known null
    instead, call `gaussian_pair_epsilon(0, d ** -0.5, mu_1, s_1, delta)` with this result's
    inserted fit.

    This is an estimate, not a bound: it has no confidence interval, and with few canaries its
    sampling error is large (both fits enter it).
    """
    inserted = _sample(inserted_cosines, "inserted")
    unseen = _sample(unseen_cosines, "unseen")
    if min(inserted.size, unseen.size) < MINIMUM_CANARIES:
        raise ConfigError(
            f"the empirical privacy estimate needs at least {MINIMUM_CANARIES} inserted and "
            f"{MINIMUM_CANARIES} unseen canary cosines; got {inserted.size} inserted and "
            f"{unseen.size} unseen")
    mu_1, s_1 = float(inserted.mean()), float(inserted.std(ddof=1))
    mu_0, s_0 = float(unseen.mean()), float(unseen.std(ddof=1))
    return EmpiricalEstimate(
        epsilon=gaussian_pair_epsilon(mu_0, s_0, mu_1, s_1, delta), delta=float(delta),
        inserted_mean=mu_1, inserted_std=s_1, unseen_mean=mu_0, unseen_std=s_0,
        inserted=int(inserted.size), unseen=int(unseen.size))
