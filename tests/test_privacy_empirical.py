"""The one-shot empirical privacy estimate (mcfl.privacy.empirical, after Andrew et al., ICLR
2024) against dp-accounting's Gaussian mechanism, Balle & Wang's analytic formula, numerical
integration of the hockey-stick divergence and simulated canaries."""

from __future__ import annotations

import json
import math

import dp_accounting
import jax
import numpy as np
import pytest
from scipy import optimize, stats

from mcfl.errors import ConfigError
from mcfl.privacy import empirical
from mcfl.privacy.empirical import (
    EmpiricalEstimate,
    canary_directions,
    cosines,
    estimate_epsilon,
    gaussian_pair_epsilon,
)

DELTA = 1e-5


def analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    """Balle & Wang (2018): the root in epsilon of
    Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) = delta."""
    def excess(eps):
        return (stats.norm.cdf(-eps / mu + mu / 2)
                - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta)
    return optimize.brentq(excess, 0.0, 500.0, xtol=1e-13)


def integrated_delta(mu_p, s_p, mu_q, s_q, eps) -> float:
    """delta_{P||Q}(eps) = integral of max(0, p - e^eps q), by the trapezoid rule on a fine grid:
    an oracle independent of the module's closed-form regions."""
    width = 14 * max(s_p, s_q)
    x = np.linspace(min(mu_p, mu_q) - width, max(mu_p, mu_q) + width, 2_000_001)
    gap = np.maximum(stats.norm.pdf(x, mu_p, s_p) - math.exp(eps) * stats.norm.pdf(x, mu_q, s_q),
                     0.0)
    return float(np.trapezoid(gap, x))


# --- gaussian_pair_epsilon ---


@pytest.mark.parametrize("z", [0.5, 1.0, 2.0])
def test_equal_sigmas_give_dp_accounting_gaussian_mechanism(z):
    expected = dp_accounting.pld.PLDAccountant().compose(
        dp_accounting.GaussianDpEvent(z)).get_epsilon(DELTA)
    got = gaussian_pair_epsilon(0.0, 1.0, 1.0 / z, 1.0, DELTA)
    assert got == pytest.approx(expected, rel=1e-3)
    # and Balle & Wang's analytic formula, to solver precision, at any common scale
    assert got == pytest.approx(analytic_gaussian_epsilon(1.0 / z, DELTA), rel=1e-8)
    assert gaussian_pair_epsilon(3.0, 0.25, 3.0 - 0.25 / z, 0.25, DELTA) == pytest.approx(
        got, rel=1e-8)


@pytest.mark.parametrize("args", [(0.0, 1.0, 0.5, 1.3), (0.2, 0.01, 0.23, 0.008)])
def test_unequal_sigmas_match_integrated_hockey_stick(args):
    mu_0, s_0, mu_1, s_1 = args
    one_way = []
    # each direction on its own (the narrower distribution against the wider one has a bounded
    # privacy loss, the other an unbounded one): delta(its epsilon) is the target delta
    for p, q in [((mu_0, s_0), (mu_1, s_1)), ((mu_1, s_1), (mu_0, s_0))]:
        eps = empirical._one_way_epsilon(*p, *q, DELTA)
        assert 0 < eps < math.inf
        assert integrated_delta(*p, *q, eps) == pytest.approx(DELTA, rel=1e-3)
        assert integrated_delta(*p, *q, 0.97 * eps) > 1.1 * DELTA
        one_way.append(eps)
    assert gaussian_pair_epsilon(mu_0, s_0, mu_1, s_1, DELTA) == max(one_way)


def test_interval_masses_in_log_space():
    # the regions' Gaussian masses on either side of the mean, against the plain difference of
    # CDFs where that is accurate and against upper tails far out, where it is not
    for lower, upper, mean, std in [(-1.0, 0.5, 0.0, 1.0), (0.3, 2.0, 0.0, 0.5),
                                    (-3.0, -1.0, 0.0, 1.0), (2.0, math.inf, 1.0, 1.0),
                                    (-math.inf, 0.0, 1.0, 2.0)]:
        a, b = (lower - mean) / std, (upper - mean) / std
        expected = math.log(stats.norm.cdf(b) - stats.norm.cdf(a))
        assert empirical._log_mass(lower, upper, mean, std) == pytest.approx(expected, rel=1e-9)
    # 30 to 30.1 std above the mean: Phi's difference is 0 in floats, the log mass is not
    expected = stats.norm.logsf(30.0) + math.log1p(-math.exp(stats.norm.logsf(30.1)
                                                              - stats.norm.logsf(30.0)))
    assert empirical._log_mass(30.0, 30.1, 0.0, 1.0) == pytest.approx(expected, rel=1e-9)
    assert empirical._log_mass(-30.1, -30.0, 0.0, 1.0) == pytest.approx(expected, rel=1e-9)
    assert empirical._log_mass(1.0, 1.0, 0.0, 1.0) == -math.inf


def test_symmetric_zero_for_equal_and_increasing_in_the_gap():
    for mu_0, s_0, mu_1, s_1 in [(0.0, 1.0, 1.5, 1.0), (0.1, 0.5, -0.4, 0.8)]:
        assert gaussian_pair_epsilon(mu_0, s_0, mu_1, s_1, DELTA) == pytest.approx(
            gaussian_pair_epsilon(mu_1, s_1, mu_0, s_0, DELTA), rel=1e-12)
    assert gaussian_pair_epsilon(0.3, 0.7, 0.3, 0.7, DELTA) == 0.0
    # distributions within delta in total variation are (0, delta)-close
    assert gaussian_pair_epsilon(0.0, 1.0, 1e-7, 1.0, DELTA) == 0.0
    gaps = [0.05, 0.2, 0.5, 1.0, 2.0, 4.0]
    eps = [gaussian_pair_epsilon(0.0, 1.0, gap, 1.0, DELTA) for gap in gaps]
    assert all(b > a for a, b in zip(eps, eps[1:]))
    # a larger spread in either distribution only adds to the privacy loss's tails
    assert gaussian_pair_epsilon(0.0, 1.0, 1.0, 1.2, DELTA) > eps[3]


def test_degenerate_sigmas_and_bad_delta():
    assert gaussian_pair_epsilon(0.0, 0.0, 1.0, 0.0, DELTA) == math.inf
    assert gaussian_pair_epsilon(0.0, 0.0, 1.0, 2.0, DELTA) == math.inf
    assert gaussian_pair_epsilon(1.0, 0.0, 1.0, 0.0, DELTA) == 0.0
    for delta in (0.0, 1.0, -1e-3):
        with pytest.raises(ConfigError, match="delta"):
            gaussian_pair_epsilon(0.0, 1.0, 1.0, 1.0, delta)


# --- canary_directions and cosines ---


def test_canary_directions_are_unit_and_nearly_orthogonal_in_high_dimension():
    d, count = 10_000, 200
    directions = canary_directions(jax.random.key(0), count, d)
    assert directions.shape == (count, d) and directions.dtype == np.float32
    rows = np.asarray(directions, dtype=np.float64)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    pairs = (rows @ rows.T)[np.triu_indices(count, k=1)]  # 19,900 cosines of distinct pairs
    np.testing.assert_allclose(np.asarray(cosines(directions[0], directions[1:])),
                               pairs[:count - 1], atol=1e-6)
    # Two independent random unit vectors have a cosine of mean 0 and variance 1/d; the pairs'
    # cosines are uncorrelated (and so are their squares), so their sample std has a relative
    # standard error of about 1/sqrt(2 * 19900) = 0.5%: 2% is 4 of them (this seed: 0.07% off).
    assert pairs.std() == pytest.approx(1 / math.sqrt(d), rel=0.02)
    assert abs(pairs.mean()) < 4 / math.sqrt(d * pairs.size)
    # the same key gives the same directions, another key others
    np.testing.assert_array_equal(canary_directions(jax.random.key(0), 3, 5),
                                  canary_directions(jax.random.key(0), 3, 5))
    assert not np.allclose(canary_directions(jax.random.key(0), 3, 5),
                           canary_directions(jax.random.key(2), 3, 5))


def test_cosines_against_numpy_and_a_zero_change():
    rng = np.random.default_rng(3)
    change = rng.normal(size=40).astype(np.float32)
    directions = rng.normal(size=(6, 40)).astype(np.float32)
    expected = directions @ change / (np.linalg.norm(directions, axis=1) * np.linalg.norm(change))
    np.testing.assert_allclose(np.asarray(cosines(change, directions)), expected, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(cosines(np.zeros(40), directions)), np.zeros(6))
    with pytest.raises(ConfigError, match="shape"):
        cosines(change, directions[:, :39])


# --- estimate_epsilon ---


def test_estimate_recovers_the_gaussian_mechanism_epsilon():
    rng = np.random.default_rng(0)
    inserted, unseen = rng.normal(2.0, 1.0, 2_000), rng.normal(0.0, 1.0, 2_000)
    estimate = estimate_epsilon(inserted, unseen, DELTA)
    # The truth is mu = 2 (about 10.0 at 1e-5). The estimate's spread over seeds comes mostly
    # from the fitted std ratio, which the tails at delta = 1e-5 amplify: about 4 seeds in 5
    # fall within 10% at 2,000 samples each; this seed gives 9.98.
    assert estimate.epsilon == pytest.approx(analytic_gaussian_epsilon(2.0, DELTA), rel=0.10)
    assert estimate.inserted_mean == pytest.approx(inserted.mean())
    assert estimate.inserted_std == pytest.approx(inserted.std(ddof=1))
    assert estimate.unseen_mean == pytest.approx(unseen.mean())
    assert estimate.unseen_std == pytest.approx(unseen.std(ddof=1))
    assert (estimate.inserted, estimate.unseen, estimate.delta) == (2_000, 2_000, DELTA)
    assert estimate.epsilon == gaussian_pair_epsilon(
        unseen.mean(), unseen.std(ddof=1), inserted.mean(), inserted.std(ddof=1), DELTA)
    record = estimate.to_dict()
    assert EmpiricalEstimate(**json.loads(json.dumps(record))) == estimate
    assert type(record["inserted"]) is int and type(record["epsilon"]) is float


def test_estimate_is_near_zero_for_one_distribution():
    rng = np.random.default_rng(0)
    estimate = estimate_epsilon(rng.normal(0, 1, 2_000), rng.normal(0, 1, 2_000), DELTA)
    # Not exactly 0: two fits to 2,000 samples differ by chance (standard errors: 0.032 in the
    # mean gap, in units of the std, and 0.022 in the std ratio), and unequal fitted stds make
    # the privacy loss grow in the tails. One standard error of each gives epsilon 0.37, two
    # give 0.83; this seed gives 0.12, and 0.5 is far below the 10.0 of the test above.
    assert 0 <= estimate.epsilon < 0.5


def test_estimate_needs_two_cosines_of_each_kind():
    with pytest.raises(ConfigError, match="at least 2 inserted and 2 unseen.*1 inserted and 5"):
        estimate_epsilon([0.1], [0.0] * 5, DELTA)
    with pytest.raises(ConfigError, match="0 inserted and 1 unseen"):
        estimate_epsilon([], [0.0], DELTA)
    with pytest.raises(ConfigError, match="NaN"):
        estimate_epsilon([0.1, float("nan")], [0.0, 0.1], DELTA)


# --- end to end, without federated training ---


def simulated_estimates(seed: int, canaries: int, sigmas, dimension: int = 2_000):
    """Estimates for a final change = the sum of `canaries` inserted unit directions (each
    weight 1, as a canary client's clipped update) + sigma * one N(0, I_d) noise draw, with
    as many unseen directions, for each sigma."""
    keys = jax.random.split(jax.random.key(seed), 3)
    inserted = canary_directions(keys[0], canaries, dimension)
    unseen = canary_directions(keys[1], canaries, dimension)
    noise = jax.random.normal(keys[2], (dimension,))
    out = []
    for sigma in sigmas:
        change = inserted.sum(axis=0) + sigma * noise
        out.append(estimate_epsilon(cosines(change, inserted), cosines(change, unseen), DELTA))
    return out


def test_end_to_end_fifty_canaries():
    # Per canary, the cosine's mean gap is 1/|change| and its noise std sqrt(sigma^2 + 49/d) /
    # |change| (the other 49 canaries add 1/d variance each), so the truth is the Gaussian
    # mechanism's epsilon with noise multiplier sqrt(sigma^2 + 49/d) -- what matters is sigma per
    # coordinate against the canary's norm 1, not the total noise norm: sigma = 1 is z = 1
    # (epsilon 4.3), sigma = 10 is z = 10 (epsilon 0.34), sigma = 0 is z = 0.157 (epsilon 47,
    # finite: the other canaries are the noise).
    low, high = simulated_estimates(0, 50, [10.0, 0.0])
    assert high.epsilon > 10 and math.isfinite(high.epsilon)
    # With 50 cosines a side the fitted std ratio alone puts the estimate's floor at a few units
    # (this seed gives 9.4 for sigma = 10, the worst of 30 seeds; the median seed 2.3); the
    # check that holds over seeds is the gap to the noiseless run (ratio at most 0.19 over 30).
    assert low.epsilon < high.epsilon / 4
    assert low.inserted == low.unseen == 50


def test_end_to_end_five_hundred_canaries_tracks_the_noise():
    sigmas = [10.0, 1.0, 0.0]
    estimates = [e.epsilon for e in simulated_estimates(1, 500, sigmas)]
    truth = [analytic_gaussian_epsilon(1 / math.sqrt(s**2 + 499 / 2_000), DELTA) for s in sigmas]
    # truth: 0.34, 3.85, 10.0; over 30 seeds the estimates lay in [0.17, 2.0], [3.6, 6.4],
    # [9.9, 12.7] (with few canaries the fit's std error biases the estimate up).
    assert estimates[0] < 2.5
    assert 0.8 * truth[1] < estimates[1] < 2 * truth[1]
    assert 0.9 * truth[2] < estimates[2] < 1.5 * truth[2]
    assert estimates[0] < estimates[1] < estimates[2]
