"""Clients as they are (`mcfl.system`): the clock by hand, dropouts, deadlines, over-selection
and availability in every registered algorithm, and asynchronous aggregation (FedBuff,
FedAsync, ifca_async) against hand-built events and against FedAvg."""

from __future__ import annotations

import csv
import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conformance_setup import SETTINGS, build_small, planted_data
from conftest import Bound
from fault_driver import mcfl_killed_at

import mcfl
from mcfl.algorithms import get, names
from mcfl.algorithms.asynchronous.servers import fedasync_update, fedbuff_update
from mcfl.algorithms.wrappers.system_rounds import with_system
from mcfl.apps.cli import main
from mcfl.errors import ConfigError
from mcfl.files.faults import FaultPlan
from mcfl.sweeps.spec import expand, group
from mcfl.system.clock import client_seconds, synchronous_round
from mcfl.system.devices import (
    Distribution,
    Profile,
    SystemModel,
    model_megabytes,
    next_online,
    online_at,
    online_until,
    parse_availability,
    parse_distribution,
)
from mcfl.system.events import InFlight, Ring, arrivals, staleness_weight

REPO = Path(__file__).resolve().parents[1]
TINY = mcfl.RunConfig(algorithm="fedavg", dataset="synthetic", clients=30, clients_per_round=6,
                      rounds=3, local_steps=2, embed_clients=0, model="mclr")


def profile(speed, bandwidth=None, latency=None, online=None, count=None, period=math.inf):
    n = len(speed)
    speed = jnp.asarray(speed, jnp.float32)
    bandwidth = jnp.full((n,), jnp.inf) if bandwidth is None else jnp.asarray(bandwidth,
                                                                                jnp.float32)
    latency = jnp.zeros((n,)) if latency is None else jnp.asarray(latency, jnp.float32)
    online = jnp.zeros((n, 1, 2)) if online is None else jnp.asarray(online, jnp.float32)
    count = jnp.zeros((n,), jnp.int32) if count is None else jnp.asarray(count, jnp.int32)
    return Profile(speed, bandwidth, latency, online, count, period)


# ---- the clock by hand -------------------------------------------------------------------

def test_client_seconds_by_hand():
    """A 2 MB model over 4 MB/s with 0.25 s latency: 2 (0.5 + 0.25) = 1.5 s of messages, plus
    10 steps at 2 steps/s: 6.5 s."""
    p = profile([2.0], [4.0], [0.25])
    np.testing.assert_allclose(client_seconds(p, jnp.array([0]), jnp.array([10]), 2.0), [6.5])
    assert model_megabytes({"w": jnp.zeros((10, 100)), "b": jnp.zeros(100)}) == 4.4e-3


def _round(system, p, steps, sampled=None, time_=0.0, dropout=0.0, target=None):
    clients = jnp.arange(len(steps), dtype=jnp.int32)
    sampled = jnp.ones(len(steps)) if sampled is None else jnp.asarray(sampled, jnp.float32)
    return jax.device_get(synchronous_round(
        system, p, clients, sampled, jnp.asarray(steps, jnp.int32), 1.0, time_, dropout,
        jax.random.key(0), target or len(steps)))


def test_round_timing_by_hand_deadline_and_over_selection():
    """Speeds 1, 2, 4 steps/s, 8 steps each, 1 MB over 1 MB/s (2 s of messages): finishes at
    10, 6 and 4 s. No deadline: all report, 10 s. Deadline 7 s, partial: the slow one reports
    floor((7 - 2) * 1) = 5 steps, the round lasts its 2 + 5 = 7 s. Deadline 7 s, drop: it
    reports nothing and the round waits for the deadline. Over-selection keeping 2: the
    first two (6 and 4 s), a 6 s round."""
    p = profile([1.0, 2.0, 4.0], [1.0, 1.0, 1.0])
    steps = [8, 8, 8]
    plain = _round(SystemModel(), p, steps)
    np.testing.assert_array_equal(plain.present, [1, 1, 1])
    np.testing.assert_array_equal(plain.steps, [8, 8, 8])
    assert plain.seconds == pytest.approx(10.0)
    partial = _round(SystemModel(deadline=7.0), p, steps)
    np.testing.assert_array_equal(partial.steps, [5, 8, 8])
    np.testing.assert_array_equal(partial.present, [1, 1, 1])
    assert partial.seconds == pytest.approx(7.0)
    drop = _round(SystemModel(deadline=7.0, deadline_policy="drop"), p, steps)
    np.testing.assert_array_equal(drop.present, [0, 1, 1])
    assert drop.seconds == pytest.approx(7.0)
    over = _round(SystemModel(over_select=0.5), p, steps, target=2)
    np.testing.assert_array_equal(over.present, [0, 1, 1])
    assert over.seconds == pytest.approx(6.0)
    # messages alone past the deadline: no step, no report
    late = _round(SystemModel(deadline=1.5), p, steps)
    np.testing.assert_array_equal(late.present, [0, 0, 0])


def test_going_offline_before_finishing_drops_the_client():
    """Client 0 is online in [0, 5) of a 100 s cycle and needs 8 s: it drops; client 1 is
    online in [0, 50) and reports."""
    online = [[[0.0, 5.0]], [[0.0, 50.0]]]
    p = profile([1.0, 1.0], online=online, count=[1, 1], period=100.0)
    t = _round(SystemModel(), p, [8, 8])
    np.testing.assert_array_equal(t.present, [0, 1])


def test_availability_intervals_by_hand():
    """Intervals [0, 10), [10, 20) and [90, 100) of a 100 s cycle: online at 5 until 20 (the
    touching intervals join), offline at 25 until 90, online at 95 until 120 (the stretch
    wraps into [0, 20))."""
    p = profile([1.0], online=[[[0, 10], [10, 20], [90, 100]]], count=[3], period=100.0)
    c = jnp.array([0])
    for t, on, until, back in [(5, True, 20, 5), (25, False, 25, 90), (95, True, 120, 95),
                               (195, True, 220, 195)]:
        assert bool(online_at(p, c, float(t))[0]) == on
        assert float(online_until(p, c, float(t))[0]) == until
        assert float(next_online(p, c, float(t))[0]) == back


def test_dropout_rate_is_near_one_minus_p():
    """P = 0.3 over 20,000 draws: the reported fraction within 4 standard deviations of 0.7."""
    n = 20_000
    p = profile(np.ones(n))
    t = _round(SystemModel(dropout=True), p, np.full(n, 3), dropout=0.3)
    assert abs(t.present.mean() - 0.7) < 4 * math.sqrt(0.21 / n)


def test_diurnal_on_fraction_is_kept():
    """diurnal:100,0.25: at any time about a quarter of 4,000 clients are online."""
    from mcfl.system.devices import draw_profile

    system = SystemModel(availability=parse_availability("diurnal:100,0.25"))
    p = draw_profile(system, 4000, jax.random.key(3))
    everyone = jnp.arange(4000)
    for t in (0.0, 37.0, 250.0):
        share = float(online_at(p, everyone, t).mean())
        assert abs(share - 0.25) < 4 * math.sqrt(0.25 * 0.75 / 4000)


def test_distributions_draw_what_they_say():
    key = jax.random.key(1)
    x = np.asarray(parse_distribution("lognormal:0.5,0.2", "--x").draw(key, 20_000))
    assert abs(np.log(x).mean() - 0.5) < 0.01 and abs(np.log(x).std() - 0.2) < 0.01
    u = np.asarray(parse_distribution("uniform:1,3", "--x").draw(key, 20_000))
    assert u.min() >= 1 and u.max() <= 3 and abs(u.mean() - 2) < 0.02
    pareto = np.asarray(Distribution("pareto", (3.0, 2.0)).draw(key, 50_000))
    assert pareto.min() >= 2 and abs(pareto.mean() - 3.0) < 0.05  # shape a: mean a s/(a-1)


# ---- every algorithm under clients as they are ------------------------------------------

SYNCHRONOUS = [n for n in names() if not get(n).asynchronous]


@pytest.fixture(scope="module")
def data():
    return planted_data()


def _under_system(name):
    """`name` under the system model with dropouts, its init and round jitted once with the
    dropout chance an argument (traced, as a sweep over it traces it): one program serves
    every chance. Returns (the Bound at a chance, init(p, data, key), round(p, state, data,
    key, r))."""
    small = build_small(name)
    wrapped = with_system(small.algorithm, SystemModel(dropout=True), SETTINGS["per_round"],
                          0.001)

    def at(dropout):
        return Bound(wrapped, small.hp.replace(client_dropout=dropout), small.block_size)

    init = jax.jit(lambda p, data, key: at(p).init(data, key))
    step = jax.jit(lambda p, state, data, key, r: at(p).round(state, data, key, r))
    return at, init, step


def _models(bound, state, data):
    models, index = bound.client_models(state, data)
    return models


@pytest.mark.parametrize("name", SYNCHRONOUS)
def test_every_algorithm_keeps_its_models_when_nobody_reports(name, data):
    """Two rounds in which every sampled client drops out (P = 1 - 1e-7): the round runs,
    reports nobody, and every client is evaluated with the model it had before (a cluster, a
    personal model or the global one that hears from nobody keeps it); then two rounds with
    P = 0.3 run and report some (the same compiled programs, P traced)."""
    arrays = data.arrays
    at, init, step = _under_system(name)
    nobody = jnp.float32(1.0 - 1e-7)
    bound = at(nobody)
    init_key, rounds_key = jax.random.split(jax.random.key(0))
    state0 = init(nobody, arrays, init_key)
    state = state0
    for r in (1, 2):
        state, metrics = step(nobody, state, arrays, jax.random.fold_in(rounds_key, r), r)
        assert float(metrics["clients_reported"]) == 0
        assert float(metrics["clients_dropped"]) == float(metrics["clients_sampled"]) > 0
    if name == "fedsoft":
        # its importance estimate (every tau rounds) asks every client, and changes how a
        # client that never trained mixes the centers: the centers and rows are what is kept
        before, after = bound.device_state(state0), bound.device_state(state)
        chex.assert_trees_all_close((after.algorithm[0].centers, after.rows),
                                    (before.algorithm[0].centers, before.rows), atol=1e-6)
    else:
        chex.assert_trees_all_close(_models(bound, state, arrays),
                                    _models(bound, state0, arrays), atol=1e-6)
    some = jnp.float32(0.3)
    state = init(some, arrays, init_key)
    reported = 0.0
    for r in (1, 2):
        state, metrics = step(some, state, arrays, jax.random.fold_in(rounds_key, r), r)
        assert all(np.isfinite(v) for v in jax.device_get(metrics).values()), metrics
        reported += float(metrics["clients_reported"])
    assert reported > 0


# ---- runs through the command line and the Python API --------------------------------------

def _params(result):
    return jax.device_get(result.state)


def test_dropout_zero_is_the_run_without_it_bit_for_bit(tmp_path):
    plain = mcfl.run(TINY)
    zero = mcfl.run(TINY.replace(client_dropout=0.0))
    assert [r["train_loss"] for r in plain.rounds] == [r["train_loss"] for r in zero.rounds]
    assert [r["accuracy_micro"] for r in plain.rounds] == \
        [r["accuracy_micro"] for r in zero.rounds]
    assert "sim_time" not in plain.rounds[-1] and "sim_time" in zero.rounds[-1]


def test_fedavg_with_dropout_reports_about_seventy_percent(tmp_path):
    """--client-dropout 0.3, 20 clients a round for 30 rounds (600 draws): the reported share
    within 4 standard deviations of 0.7, and rounds.csv says how many were sampled, reported
    and dropped."""
    out = tmp_path / "run"
    assert main(["run", "--algorithm", "fedavg", "--dataset", "synthetic", "--clients", "40",
                 "--clients-per-round", "20", "--rounds", "30", "--model", "mclr",
                 "--local-steps", "1", "--eval-every", "30", "--embed-clients", "0",
                 "--client-dropout", "0.3", "--device-speeds", "lognormal:0,1", "--out",
                 str(out)]) == 0
    with open(out / "rounds.csv") as f:
        rows = list(csv.DictReader(f))
    sampled = sum(float(r["clients_sampled"]) for r in rows)
    reported = sum(float(r["clients_reported"]) for r in rows)
    dropped = sum(float(r["clients_dropped"]) for r in rows)
    assert sampled == 600 and reported + dropped == 600
    assert abs(reported / sampled - 0.7) < 4 * math.sqrt(0.21 / 600)
    times = [float(r["sim_time"]) for r in rows]
    assert all(b > a for a, b in zip(times, times[1:]))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sim_time"] == pytest.approx(times[-1])


def test_round_seconds_of_a_run_by_hand():
    """Constant 4 steps/s, 2 local steps, bandwidth 1 MB/s and latency 0.5 s, MCLR on the
    synthetic data (60 features, 10 classes: 610 parameters, 0.00244 MB): every round lasts
    2 (0.00244 / 1 + 0.5) + 2 / 4 = 1.50488 s."""
    result = mcfl.run(TINY.replace(device_speeds="constant:4", bandwidth="constant:1",
                                   latency=0.5))
    mb = 4 * 610 / 1e6
    for i, row in enumerate(result.rounds, start=1):
        assert row["round_seconds"] == pytest.approx(2 * (mb + 0.5) + 0.5, rel=1e-5)
        assert row["sim_time"] == pytest.approx(i * (2 * (mb + 0.5) + 0.5), rel=1e-5)


def test_over_selection_and_availability_run():
    result = mcfl.run(TINY.replace(over_select=0.5, availability="diurnal:20,0.5",
                                   device_speeds="lognormal:0,1"))
    for row in result.rounds:
        assert row["clients_reported"] <= 6  # S = 6 of ceil(1.5 * 6) = 9 asked
        assert row["clients_sampled"] <= 9


# ---- asynchronous aggregation ---------------------------------------------------------------

def test_staleness_weights_by_hand():
    tau = jnp.array([0, 1, 3, 8])
    np.testing.assert_allclose(staleness_weight("polynomial", tau, 0.5, 0),
                               [1, 1 / math.sqrt(2), 0.5, 1 / 3], rtol=1e-6)
    np.testing.assert_allclose(staleness_weight("hinge", tau, 10.0, 2.0),
                               [1, 1, 1 / 11, 1 / 61], rtol=1e-6)
    np.testing.assert_allclose(staleness_weight("constant", tau, 0.5, 0), [1, 1, 1, 1])


def test_hand_built_events_arrive_in_order_with_their_staleness():
    """Four clients in flight finishing at 7, 3, 9, 5 s, started at versions 2, 0, 3, 1, the
    server at version 4, steps of K = 2: the arrivals are slots 1 and 3 (3 s, 5 s), staleness
    4 and 3, FedBuff weights 1/sqrt(5) and 1/2; in a ring of R = 4 the version-0 start has
    left (4 >= R: discarded), version 1's is row 1."""
    flight = InFlight(jnp.array([10, 11, 12, 13]), jnp.array([2, 0, 3, 1]),
                      jnp.array([7.0, 3.0, 9.0, 5.0]), jnp.ones(4, bool), jnp.zeros(4, jnp.int32))
    slots = arrivals(flight, 2)
    np.testing.assert_array_equal(slots, [1, 3])
    staleness = 4 - flight.version[slots]
    np.testing.assert_array_equal(staleness, [4, 3])
    np.testing.assert_allclose(staleness_weight("polynomial", staleness, 0.5, 0),
                               [1 / math.sqrt(5), 0.5], rtol=1e-6)
    ring = Ring.of({"w": jnp.zeros((1, 2))}, 4)
    assert bool(staleness[0] < ring.size) is False and bool(staleness[1] < ring.size)
    np.testing.assert_array_equal(ring.rows(flight.version[slots], jnp.zeros(2, jnp.int32)),
                                  [0, 1])


def test_server_updates_by_hand():
    """FedBuff: x = 1, two updates used, summed (s - starts) = 0.6: x + 0.5 * 0.6 / 2 = 1.15;
    a cluster without arrivals keeps its 5. FedAsync: x = 1, y = 3 with s(tau) = 0.5,
    alpha = 0.6: a = 0.3, (1 - a) 1 + a 3 = 1.6."""
    from mcfl.algorithms.asynchronous.servers import FedAsyncParams, FedBuffParams

    models = {"w": jnp.array([[1.0], [5.0]])}
    sums, starts = {"w": jnp.array([[2.6], [0.0]])}, {"w": jnp.array([[2.0], [0.0]])}
    new = fedbuff_update(models, sums, starts, None, jnp.array([2.0, 0.0]),
                         FedBuffParams(server_lr=0.5))
    np.testing.assert_allclose(new["w"], [[1.15], [5.0]], rtol=1e-6)
    one = {"w": jnp.array([[1.0]])}
    new = fedasync_update(one, {"w": jnp.array([[1.5]])}, None, jnp.array([0.5]), None,
                          FedAsyncParams(async_alpha=0.6))
    np.testing.assert_allclose(new["w"], [[1.6]], rtol=1e-6)


def test_fedbuff_with_k_equal_c_and_equal_speeds_is_fedavg():
    """All 10 clients of equal size train at once at one speed, K = C = 10: every step takes
    them all, staleness 0, so FedBuff's step is the plain average, FedAvg's with all clients
    (equal sizes: n_i weights are equal); three steps against three rounds."""
    from mcfl.data import from_splits

    rng = np.random.default_rng(0)
    owner = np.repeat(np.arange(10), 20)
    x = rng.normal(size=(200, 6)).astype(np.float32)
    y = rng.integers(0, 3, 200)
    test_owner = np.repeat(np.arange(10), 4)
    dataset = from_splits("equal", (x, y, owner), (x[:40], y[:40], test_owner), 10, 3)
    common = dict(dataset="synthetic", clients=10, clients_per_round=10, rounds=3,
                  local_steps=3, embed_clients=0, model="mclr", device_speeds="constant:2")
    fedavg = mcfl.run(mcfl.RunConfig(algorithm="fedavg", **common), dataset=dataset)
    fedbuff = mcfl.run(mcfl.RunConfig(algorithm="fedbuff", concurrency=10, buffer_size=10,
                                      **{**common, "clients_per_round": None}), dataset=dataset)
    chex.assert_trees_all_close(jax.tree.map(lambda m: m[0], fedbuff.state.models),
                                fedavg.state[0].params, atol=1e-5)  # (fedavg, its clock)
    for a, b in zip(fedavg.rounds, fedbuff.rounds):
        assert a["accuracy_micro"] == pytest.approx(b["accuracy_micro"], abs=1e-6)
        assert b["staleness"] == 0
    assert fedbuff.rounds[-1]["sim_time"] == pytest.approx(3 * 3 / 2)


def test_async_runs_write_sim_time_and_ifca_async_clusters():
    for name, extra in [("fedbuff", {"buffer_size": 3}), ("fedasync", {}),
                        ("ifca_async", {"buffer_size": 3, "clusters": 2})]:
        result = mcfl.run(TINY.replace(algorithm=name, clients_per_round=None,  # noqa
                                       concurrency=6, rounds=4,
                                       device_speeds="lognormal:0,1", **extra))
        times = [r["sim_time"] for r in result.rounds]
        assert all(b >= a for a, b in zip(times, times[1:])) and times[-1] > 0
        assert max(r["staleness"] for r in result.rounds) > 0  # heavy tails make stale ones


# ---- sweeps, resume, bad input ---------------------------------------------------------------

def test_a_dropout_sweep_is_one_program_and_buffer_sizes_are_not():
    members = expand(TINY.replace(client_dropout=0.1), [0, 1],
                     {"client_dropout": [0.1, 0.3, 0.5]})
    assert len(group(members)) == 1 and group(members)[0].traced == ("client_dropout",)
    base = TINY.replace(algorithm="fedbuff", concurrency=6, buffer_size=2,
                        device_speeds="constant:1")
    assert len(group(expand(base, [0], {"buffer_size": [2, 3]}))) == 2


def test_kill_and_resume_of_an_async_run_equals_the_whole_run(tmp_path):
    """fedbuff for 12 server steps with dropouts, killed (SIGKILL) after its 5th row,
    resumed: the same rounds.csv as the uninterrupted run (the clock, the clients in flight
    and the ring come back from the checkpoint)."""
    args = ["run", "--algorithm", "fedbuff", "--dataset", "synthetic", "--clients", "30",
            "--model", "mclr", "--local-steps", "2", "--rounds", "12", "--concurrency", "8",
            "--buffer-size", "3", "--embed-clients", "0", "--device-speeds", "lognormal:0,1",
            "--client-dropout", "0.2", "--checkpoint-every", "1"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    # The uninterrupted run and the resume in this process (the killed one shares their
    # compiled programs through the tests' compile cache); the kill needs a process.
    assert main([*args, "--out", str(whole)]) == 0
    killed = subprocess.run(mcfl_killed_at(FaultPlan("row", 5), *args, "--out", str(cut)),
                            cwd=REPO, capture_output=True)  # killed after the 5th row
    assert killed.returncode == -signal.SIGKILL
    assert main(["run", "--resume", str(cut)]) == 0

    def table(folder):
        with open(folder / "rounds.csv") as f:
            rows = list(csv.DictReader(f))
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]

    assert table(cut) == table(whole)


BAD_SYSTEM_SETTINGS = [
    (["--device-speeds", "constant:0"], "constant:0"),
    (["--device-speeds", "lognormal:0"], "lognormal:0"),
    (["--bandwidth", "uniform:3,1"], "uniform:3,1"),
    (["--client-dropout", "1"], "client_dropout"),
    (["--client-dropout", "-0.1"], "client_dropout"),
    (["--deadline", "0"], "deadline"),
    (["--availability", "diurnal:100,0"], "diurnal:100,0"),
    (["--availability", "sometimes"], "sometimes"),
    (["--availability", "trace:100"], "--device-trace"),
    (["--algorithm", "fedbuff", "--concurrency", "4", "--buffer-size", "5"], "buffer_size"),
    (["--algorithm", "fedbuff", "--deadline", "3"], "asynchronous"),
    (["--device-trace", "missing.csv"], "missing.csv"),
]


@pytest.mark.parametrize("flags, named", BAD_SYSTEM_SETTINGS)
def test_bad_system_settings_exit_2_naming_the_value(flags, named, tmp_path, capsys):
    """The command line's `main` in this process (its exit code is what it returns; the first
    case goes through a process of its own, `mcfl run` as a user starts it)."""
    argv = ["run", "--dataset", "synthetic", "--clients", "20", "--rounds", "1", "--out",
            str(tmp_path / "r"), *flags]
    if flags == BAD_SYSTEM_SETTINGS[0][0]:
        done = subprocess.run([sys.executable, "-m", "mcfl", *argv], capture_output=True,
                              text=True, cwd=REPO)
        code, stderr = done.returncode, done.stderr
    else:
        code, stderr = main(argv), capsys.readouterr().err
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], stderr
    assert not (tmp_path / "r").exists()


def test_a_trace_naming_an_unknown_client_is_refused(tmp_path):
    trace = tmp_path / "devices.csv"
    trace.write_text("client,speed,bandwidth\n" + "".join(f"{i},1,1\n" for i in range(19))
                     + "25,1,1\n")
    with pytest.raises(ConfigError, match="25"):
        mcfl.resolve(TINY.replace(clients=20, device_trace=str(trace)))


def test_a_trace_gives_each_client_its_device(tmp_path):
    """Client 0 at 1 step a second, the rest at 100, 2 local steps, always online: with all 6
    of 6 clients a round, every round lasts client 0's 2 s."""
    trace = tmp_path / "devices.json"
    trace.write_text(json.dumps({"clients": [
        {"client": i, "speed": 1.0 if i == 0 else 100.0, "bandwidth": "inf"}
        for i in range(6)]}))
    result = mcfl.run(TINY.replace(clients=6, device_trace=str(trace)))
    assert [r["round_seconds"] for r in result.rounds] == pytest.approx([2.0] * 3)


def test_fednova_normalises_by_the_steps_each_client_took(data):
    """Under a deadline a client takes fewer steps (`Exchange.step_limit`): FedNova's
    ||a_i||_1 (plain SGD: the step count) and tau_eff = sum_i p_i a_i follow the steps taken,
    with p_i over the clients that report: limits 1, 2, 0, 2, ... of 2 local steps, the third
    client dropped."""
    from mcfl.algorithms import Exchange

    small = build_small("fednova")
    arrays = data.arrays
    clients = jnp.arange(8, dtype=jnp.int32)
    limit = jnp.array([1, 2, 0, 2, 1, 2, 2, 1], jnp.int32)
    present = (limit > 0).astype(jnp.float32)
    state = jax.jit(small.algorithm.init)(arrays, jax.random.key(0), small.hp)
    _, metrics, _ = small.algorithm.round(state, arrays, jax.random.key(1), small.hp,
                                          Exchange(clients, present=present, step_limit=limit))
    counts = np.asarray(arrays.train_counts[:8], np.float64) * np.asarray(present)
    expected = float(np.sum(counts / counts.sum() * np.minimum(2, np.asarray(limit))))
    assert float(metrics["tau_eff"]) == pytest.approx(expected, rel=1e-5)
    assert float(metrics["local_steps"]) == pytest.approx(
        float(np.asarray(limit)[np.asarray(limit) > 0].mean()), rel=1e-5)
