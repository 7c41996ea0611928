"""Client-level DP (`mcfl.privacy`): clipping and noise by hand and by statistics, Poisson
sampling's rate, adaptive clipping's step by hand, the run's epsilon against dp-accounting,
the plain run recovered with no noise and no clipping, every covered algorithm's round under
DP and every refused one's line, a sweep member equal to its run, and a stopped DP run resumed
to the uninterrupted one (its noise stream and accountant continue)."""

from __future__ import annotations

import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conformance_setup import build_small, planted_data
from conftest import Bound
from test_checkpoint import SignalAt, assert_same_run

import mcfl
from mcfl.algorithms import names
from mcfl.apps.cli import main
from mcfl.errors import ConfigError
from mcfl.privacy import support
from mcfl.privacy.mechanism import (
    ADAPTIVE_LR,
    DPState,
    Mechanism,
    clip_tree,
    gaussian_mechanism,
)
from mcfl.privacy.plan import privacy_plan
from mcfl.privacy.sampling import poisson_capacity, poisson_clients
from mcfl.transforms import global_norm

TINY = mcfl.RunConfig(algorithm="fedavg", dataset="synthetic", clients=30, clients_per_round=6,
                      rounds=3, local_steps=2, embed_clients=0)


def test_clipping_by_hand_flat_and_per_layer():
    """||(3, 4), (12)|| = 13 clipped to 6.5 halves both leaves; per layer, each of the 2 leaves
    is clipped to 6.5 / sqrt(2) (the joint norm then at most 6.5); a small update is kept."""
    tree = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([12.0])}
    flat = clip_tree(tree, jnp.float32(6.5), per_layer=False)
    np.testing.assert_allclose(flat["a"], [1.5, 2.0], rtol=1e-6)
    np.testing.assert_allclose(flat["b"], [6.0], rtol=1e-6)
    layered = clip_tree(tree, jnp.float32(6.5), per_layer=True)
    bound = 6.5 / math.sqrt(2)
    np.testing.assert_allclose(layered["a"], np.array([3.0, 4.0]) * bound / 5.0, rtol=1e-6)
    np.testing.assert_allclose(layered["b"], [bound], rtol=1e-6)
    assert float(global_norm(layered)) <= 6.5 + 1e-5
    small = {"a": jnp.array([0.3, 0.4])}
    np.testing.assert_allclose(clip_tree(small, jnp.float32(1.0), False)["a"], [0.3, 0.4])
    # random updates of every size come out at norm <= C
    updates = jax.random.normal(jax.random.key(1), (64, 50)) * jnp.logspace(-2, 2, 64)[:, None]
    norms = jax.vmap(lambda u: global_norm(clip_tree({"u": u}, jnp.float32(0.7), False)))(
        updates)
    assert float(jnp.max(norms)) <= 0.7 * (1 + 1e-6)


def test_noise_on_an_aggregate_has_std_z_c_over_the_denominator():
    """One segment: the noised update sum divided by the fixed denominator m has standard
    deviation z C / m (20,000 coordinates: the sample std is within 3% with room to spare:
    its relative standard error is 1 / sqrt(2 n) = 0.5%); the weight becomes m. Several
    segments: the counts are noised with std z (sensitivity 1)."""
    z, clip, m = 1.3, 0.8, 25.0
    transform = gaussian_mechanism(Mechanism(clip, z, m))
    state = transform.init()
    sums, weights, _ = transform.server({"w": jnp.zeros((1, 20_000))}, jnp.array([17.0]),
                                        state, jax.random.key(0))
    mean = np.asarray(sums["w"][0]) / float(weights[0])
    assert float(weights[0]) == m  # the count is not released
    assert np.std(mean) == pytest.approx(z * clip / m, rel=0.03)
    assert abs(np.mean(mean)) < 4 * z * clip / m / math.sqrt(20_000)
    clustered = gaussian_mechanism(Mechanism(clip, z, m, noised_counts=True))
    keys = jax.random.split(jax.random.key(1), 4000)
    counts = jax.vmap(lambda k: clustered.server({"w": jnp.zeros((3, 2))},
                                                 jnp.array([500.0, 400.0, 300.0]), state,
                                                 k)[1])(keys)
    assert np.std(np.asarray(counts) - np.array([500.0, 400.0, 300.0])) == pytest.approx(
        z, rel=0.05)
    # a plain mechanism refuses a round with several segments
    with pytest.raises(ConfigError, match="one aggregated segment"):
        transform.server({"w": jnp.zeros((2, 3))}, jnp.ones(2), state, jax.random.key(0))


def test_adaptive_clipping_step_by_hand():
    """Andrew et al. 2021's geometric update: 2 of 4 reporting clients within C = 1 (the
    absent slot does not count), sigma_b = m / 20, C <- C exp(-0.2 (b~ - gamma))."""
    mechanism = Mechanism(1.0, 1.0, 4.0, adaptive_quantile=0.8)
    transform = gaussian_mechanism(mechanism)
    key = jax.random.key(7)
    norms = jnp.array([0.5, 2.0, 3.0, 0.1, 0.2])
    present = jnp.array([1.0, 1.0, 1.0, 1.0, 0.0])
    new = transform.observe(DPState(jnp.float32(1.0), jnp.float32(1.0)), norms, present, key)
    noisy = 2.0 + (4.0 / 20.0) * float(jax.random.normal(key, ()))
    want = math.exp(-ADAPTIVE_LR * (noisy / 4.0 - 0.8))
    assert float(new.clip) == pytest.approx(want, rel=1e-5)
    assert want > 1.0  # half within C against a target of 80%: C grows
    # its privacy: the bits are a third query (sensitivity 1/2), composed
    assert mechanism.released_noise() == pytest.approx((1.0 + (2 * 0.2) ** -2) ** -0.5)


def test_poisson_sampling_rate_and_slots():
    """q = 50 / 500: over 400 rounds the reporting count has mean q N and variance
    N q (1 - q) (both within 4 standard errors), every client joins about q of the rounds,
    nothing overflows the q N + 6 sd slots, and the joined come first."""
    population, expected = 500, 50
    capacity = poisson_capacity(population, expected)
    assert capacity == math.ceil(50 + 6 * math.sqrt(500 * 0.1 * 0.9))
    keys = jax.random.split(jax.random.key(3), 400)
    clients, present, overflow = jax.vmap(
        lambda k: poisson_clients(k, population, 0.1, capacity))(keys)
    counts = np.asarray(present.sum(axis=1))
    assert abs(counts.mean() - 50) < 4 * math.sqrt(45 / 400)
    assert np.var(counts, ddof=1) == pytest.approx(45, rel=0.25)
    assert int(np.asarray(overflow).max()) == 0
    p = np.asarray(present)
    assert all(np.all(np.diff(row) <= 0) for row in p)  # 1s then 0s
    joined = np.zeros(population)
    for row, chosen in zip(p, np.asarray(clients)):
        assert len(set(chosen)) == capacity  # distinct slots
        joined[chosen[row > 0]] += 1
    assert abs(joined.mean() / 400 - 0.1) < 0.005


def test_the_run_epsilon_is_dp_accountings():
    """The acceptance case's accounting: 30 Poisson-sampled (q = 0.1) Gaussian rounds with
    z = 1.1 at delta 1e-5, RDP and PLD, equal to dp-accounting's own (within 1%), and a short
    run reporting the plan's epsilon after each of its rounds."""
    config = TINY.replace(clients=500, clients_per_round=50, client_sampling="poisson",
                          dp_clip=1.0, dp_noise=1.1, dp_delta=1e-5, rounds=30)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.1)), 30)
    for name, accountant in (("rdp", dp_accounting.rdp.RdpAccountant()),
                             ("pld", dp_accounting.pld.PLDAccountant())):
        plan = privacy_plan(mcfl.resolve(config.replace(dp_accountant=name)).privacy, 500, 50)
        want = accountant.compose(event).get_epsilon(1e-5)
        assert plan.epsilons()[-1] == pytest.approx(want, rel=0.01), name
    short = config.replace(clients=60, clients_per_round=6, rounds=3)
    result = mcfl.run(short)
    want = privacy_plan(mcfl.resolve(short).privacy, 60, 6).epsilons()
    assert [row["dp_epsilon"] for row in result.rounds] == pytest.approx(list(want))
    assert result.summary["dp_epsilon"] == pytest.approx(want[-1])
    assert result.summary["dp_delta"] == 1e-5 and "Poisson" in result.summary["dp_accounting"]
    assert all(0 <= row["clients_reported"] <= result.summary["clients_per_round"]
               for row in result.rounds)


def test_no_noise_and_no_clipping_is_the_plain_run():
    """FedDist (equal weights) with C = 1e30 and z = 0 under fixed-size sampling is the run
    without DP: the same clients, the same mean (the denominator is the round's count), to
    float rounding; its epsilon is infinite."""
    config = TINY.replace(algorithm="feddist")
    plain = mcfl.run(config)
    private = mcfl.run(config.replace(dp_clip=1e30, dp_noise=0.0))
    for a, b in zip(plain.rounds, private.rounds):
        for key in ("train_loss", "accuracy_micro", "test_loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    assert math.isinf(private.summary["dp_epsilon"])


@pytest.fixture(scope="module")
def small_data():
    return planted_data().arrays


@pytest.mark.parametrize("name", sorted(support.COVERED))
def test_every_covered_algorithm_runs_a_private_round(name, small_data):
    """The round of every algorithm DP covers, traced with its mechanism (noise on, a small
    C): it gives a finite state of the same shape (the sums it noises are sums of updates from
    a model it says, or the engine refuses the round in one line)."""
    covered = support.covered(name)
    mechanism = Mechanism(0.5, 1.0, 8.0, covered.sums, covered.noised_counts)
    bound = build_small(name)
    bound = Bound(bound.algorithm, bound.hp, bound.block_size,
                  transform=gaussian_mechanism(mechanism))
    init_key, round_key = jax.random.split(jax.random.key(0))
    state = jax.eval_shape(bound.init, small_data, init_key)
    new_state, metrics = jax.eval_shape(bound.round, state, small_data, round_key)
    assert jax.tree.structure(new_state) == jax.tree.structure(state)
    assert "train_loss" in metrics


@pytest.mark.parametrize("name", [n for n in names() if n not in support.COVERED])
def test_every_other_algorithm_refuses_dp_in_one_line(name):
    with pytest.raises(ConfigError) as refused:
        mcfl.resolve(mcfl.RunConfig(algorithm=name, dp_clip=1.0, dp_noise=1.0))
    text = str(refused.value)
    assert "\n" not in text and name in text and support.REFUSED[name] in text


@pytest.mark.parametrize("argv, says", [
    (["--dp-clip", "0", "--dp-noise", "1"], "dp_clip"),
    (["--dp-clip", "1", "--dp-noise", "-1"], "dp_noise"),
    (["--dp-clip", "1", "--dp-noise", "1", "--dp-delta", "1.5"], "dp_delta"),
    (["--dp-clip", "1", "--dp-noise", "nan"], "dp_noise"),
    (["--dp-noise", "1"], "need(s) --dp-clip"),
    (["--dp-clip", "1"], "exactly one of --dp-noise"),
    (["--dp-clip", "1", "--dp-noise", "1", "--dp-epsilon", "2"], "exactly one of --dp-noise"),
    (["--dp-clip", "1", "--dp-noise", "1", "--algorithm", "fesem"], "--algorithm fesem"),
    (["--dp-clip", "1", "--dp-noise", "1", "--algorithm", "fedem",
      "--dp-adaptive-quantile", "0.5"], "--dp-adaptive-quantile is not available"),
    (["--dp-clip", "1", "--dp-epsilon", "1e-9", "--dp-delta", "1e-8"], "out of reach"),
    (["--dp-clip", "1", "--dp-noise", "0.3", "--dp-epsilon-budget", "0.01"],
     "spent by the first round"),
])
def test_bad_privacy_settings_are_one_line_and_exit_2(argv, says, capsys, tmp_path):
    code = main(["run", "--dataset", "synthetic", "--clients", "30", "--rounds", "2",
                 "--out", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and says in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_a_sweep_over_the_noise_is_one_program_and_each_member_is_its_run(tmp_path):
    """dp_noise = 0.5, 2 with two seeds: one group (dp_noise traced), epsilon falls as the
    noise rises, and the (z = 2, seed 1) member equals the single run with those settings."""
    config = TINY.replace(dp_clip=1.0, dp_noise=1.0)
    data = mcfl.load_dataset(config)
    result = mcfl.sweep(config, seeds=[0, 1], grid={"dp_noise": [0.5, 2.0]}, dataset=data,
                        out_dir=tmp_path / "sweep")
    assert (tmp_path / "sweep" / "privacy.png").is_file()  # the privacy-utility plot
    assert len(result.groups) == 1 and result.groups[0]["traced"] == ["dp_noise"]
    epsilons = [m["dp_epsilon"] for m in result.members]
    assert epsilons[0] == epsilons[1] > epsilons[2] == epsilons[3]
    single = mcfl.run(config.replace(dp_noise=2.0, seed=1), dataset=data)
    swept = [r for r in result.rounds if r["member"] == 3]
    for got, want in zip(swept, single.rounds):
        for key in ("train_loss", "accuracy_micro", "dp_epsilon"):
            if key in want:
                np.testing.assert_allclose(got[key], want[key], rtol=2e-4, atol=2e-5)


def test_a_stopped_private_run_resumes_to_the_uninterrupted_one(tmp_path):
    """IFCA under DP with Poisson sampling and adaptive clipping, stopped by SIGINT after round
    2 of 4 and resumed: its rounds (epsilon, noise-driven losses, the moving clip inside the
    state) and files equal the uninterrupted run's."""
    config = TINY.replace(algorithm="ifca", clusters=2, rounds=4, client_sampling="poisson",
                          dp_clip=1.0, dp_noise=0.8, dp_adaptive_quantile=0.5)
    mcfl.run(config, out_dir=tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        mcfl.run(config, out_dir=tmp_path / "cut", observers=(SignalAt(2),),
                 checkpoint_every=100)
    mcfl.run(resume=tmp_path / "cut")
    assert_same_run(tmp_path / "cut", tmp_path / "whole")


def test_canaries_estimate_lies_below_the_accountant_with_noise_and_is_large_without():
    """Andrew et al. 2024's one-shot check on a 4.5k-parameter MLP: 200 canaries joining
    FedAvg (40 of 200 clients a round, 12 rounds). With z = 1 the empirical epsilon lies below
    the accountant's (seeds 0-2 gave 3.2, 3.7, 6.1 against 30.3: fixed-size sampling is
    accounted under replace-one neighbours, a bound with room); with z = 0 (no noise, the
    accountant's epsilon infinite) it is large. (With Poisson sampling, where the RDP bound is
    nearly tight, the estimate's spread crosses it: REPRODUCTION.md, Privacy.)"""
    config = TINY.replace(model="mlp", hidden=(64,), clients=200, clients_per_round=40,
                          rounds=12, dp_clip=1.0, dp_delta=1e-5, dp_noise=1.0,
                          dp_canaries=200, eval_every=12)
    data = mcfl.load_dataset(config)
    noised = mcfl.run(config, dataset=data).summary
    assert 0 <= noised["dp_empirical_epsilon"] < noised["dp_epsilon"]
    assert noised["dp_canaries"]["inserted"] == 200 and noised["dp_canaries"]["unseen"] == 800
    free = mcfl.run(config.replace(dp_noise=0.0), dataset=data).summary
    assert math.isinf(free["dp_epsilon"]) and free["dp_empirical_epsilon"] > 20


def test_an_epsilon_budget_stops_the_run_at_the_last_round_within_it(tmp_path):
    """A budget between the epsilon after round 2 and after round 3 of 5: the run completes
    2 rounds (its last evaluated), says so in its summary, and draws epsilon in its curves."""
    config = TINY.replace(rounds=5, dp_clip=1.0, dp_noise=1.0)
    spent = privacy_plan(mcfl.resolve(config).privacy, 30, 6).epsilons()
    budget = float(spent[1] + spent[2]) / 2
    result = mcfl.run(config.replace(dp_epsilon_budget=budget), out_dir=tmp_path / "run")
    assert [row["round"] for row in result.rounds] == [1, 2]
    assert result.summary["status"] == "completed"
    assert result.summary["dp_rounds_within_budget"] == 2
    assert result.summary["dp_epsilon"] == pytest.approx(spent[1])
    assert result.summary["dp_epsilon"] <= budget
    assert "accuracy_micro" in result.rounds[-1]  # the last round within it is evaluated
    assert (tmp_path / "run" / "curves.png").is_file()
