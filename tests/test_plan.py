"""`mcfl plan`: the counted work of programs (`mcfl.planning.cost`), a run's estimate
(`mcfl.planning.estimate`) and the roofline bounds on the targets (`mcfl.planning.targets`),
checked against hand counts."""

import json

import jax
import jax.numpy as jnp
import pytest

import mcfl
from mcfl import load_dataset
from mcfl.apps import plan_command
from mcfl.apps.cli import main
from mcfl.config import RunConfig
from mcfl.engine.blocks import loop_scope, occasional_cond
from mcfl.engine.training import mean_steps, steps_key
from mcfl.errors import McflError
from mcfl.planning.cost import Cost, traced_cost, xla_cost
from mcfl.planning.estimate import bound_on, client_loop_trips, estimate_run
from mcfl.planning.targets import TARGETS, Target, for_device
from mcfl.runs import runner
from mcfl.runtime import memory

M, K, STEPS = 8, 16, 10


def _scanned(x, w):
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=STEPS)[0]


def test_a_scan_counts_its_body_as_often_as_it_runs_where_xla_counts_it_once():
    x, w = jnp.ones((M, K)), jnp.ones((K, K))
    cost = traced_cost(jax.jit(_scanned), x, w)
    assert cost.matmul_flops == STEPS * 2 * M * K * K
    assert cost.flops == STEPS * (2 * M * K * K + M * K)  # + tanh, one per element
    # every matmul reads x and w and writes its result; the program writes its result once
    assert cost.bytes == 4 * (STEPS * (M * K + K * K + M * K) + M * K)
    assert cost.while_loops == 0
    xla = xla_cost(jax.jit(_scanned).lower(x, w).compile())
    assert xla["flops"] < cost.flops / (STEPS - 1)  # what mcfl.planning.cost exists to correct


def _client_loop(n, x, w):
    with loop_scope("steps"):
        return jax.lax.fori_loop(0, n, lambda i, c: c @ w, x)


def test_a_client_loop_takes_its_trip_count_and_another_while_loop_is_counted_once():
    x, w = jnp.ones((M, K)), jnp.ones((K, K))
    per_trip = 2 * M * K * K
    counted = traced_cost(jax.jit(_client_loop), 3, x, w, trips={"steps": 7.5}.get)
    assert counted.matmul_flops == 7.5 * per_trip and counted.while_loops == 0
    unknown = traced_cost(jax.jit(_client_loop), 3, x, w)
    assert unknown.matmul_flops == per_trip and unknown.while_loops == 1


def test_a_cond_counts_its_dearest_branch_and_an_occasional_one_its_cheaper():
    def f(p, x, w):
        return jax.lax.cond(p, lambda: x @ w @ w, lambda: x @ w)

    def g(p, x, w):  # the same, as work a round does only now and then
        return occasional_cond(p, lambda: x @ w @ w, lambda: x @ w)

    x, w = jnp.ones((M, K)), jnp.ones((K, K))
    cost = traced_cost(jax.jit(f), True, x, w)
    assert cost.matmul_flops == 2 * 2 * M * K * K and cost.occasional == 0
    assert traced_cost(jax.jit(g), True, x, w).matmul_flops == 2 * M * K * K
    with_it = traced_cost(jax.jit(g), True, x, w, occasional="dearer")
    assert with_it.matmul_flops == 2 * 2 * M * K * K and with_it.occasional == 1
    # its gradient keeps the scope: forward and backward conds, each at the cheaper side
    cost = traced_cost(jax.jit(jax.grad(lambda x: g(True, x, w).sum())), x)
    cheaper = traced_cost(jax.jit(jax.grad(lambda x: (x @ w).sum())), x)
    assert cost.occasional == 2 and cost.matmul_flops == cheaper.matmul_flops > 0


def test_a_step_loop_is_counted_by_its_own_schedule():
    """Clients of 10 and 25 rows, B = 10: an epoch is 1 and 3 steps (mean 2), two epochs a
    mean of 4; a fixed count is that count."""
    two_epochs = RunConfig(local_epochs=2, batch_size=10)
    one_epoch, fixed = two_epochs.replace(local_epochs=1), two_epochs.replace(local_steps=50)
    keys = {steps_key(c) for c in (two_epochs, one_epoch, fixed)}
    assert len(keys) == 3
    assert mean_steps(steps_key(two_epochs), [10, 25]) == 4.0
    assert mean_steps(steps_key(one_epoch), [10, 25]) == 2.0
    assert mean_steps(steps_key(fixed), [10, 25]) == 50.0
    assert mean_steps("chunks", [10, 25]) is None


def test_flexcfls_round_counts_training_once_and_its_pre_training_as_one_epoch():
    """FlexCFL's round trains its clients as FedAvg's does; its newcomers' pre-training and
    migration are occasional (not in the round's lower bound), and its cold start pre-trains
    one epoch of E = 4, then goes on for the round's rest."""
    base = RunConfig(algorithm="fedavg", dataset="synthetic", clients=40, clients_per_round=8,
                     rounds=2, local_epochs=4, fast_paths="off", embed_clients=0)
    fedavg = estimate_run(base, compile=False)
    flexcfl = estimate_run(base.replace(algorithm="flexcfl", clusters=2), compile=False)
    paper, full = (estimate_run(base.replace(algorithm="flexcfl", clusters=2, pretrain=mode),
                                compile=False) for mode in ("epoch", "full"))
    rounds = (flexcfl.program("round").cost, fedavg.program("round").cost)
    assert rounds[0].occasional == 2 and fedavg.occasional_round is None
    assert rounds[1].matmul_flops <= rounds[0].matmul_flops <= 1.05 * rounds[1].matmul_flops
    # a round with its occasional work: its newcomers' and its migration's pre-training, one
    # epoch each of the round's 8 clients, beside the round's E = 4
    with_it = flexcfl.occasional_round.matmul_flops / rounds[0].matmul_flops
    assert with_it == pytest.approx((4 + 1 + 1) / 4, rel=0.05), with_it
    bound = bound_on(flexcfl, TARGETS["t4"])
    assert bound.occasional_round_seconds > bound.round_seconds
    # the cold start's clients: one epoch of pre-training, then the rest of their round
    # (counted at its schedule, E), against E epochs of pre-training (--pretrain full);
    # counting the pre-training epoch as E would give 8 / 4
    ratio = paper.program("init").cost.matmul_flops / full.program("init").cost.matmul_flops
    assert ratio == pytest.approx((1 + 4) / 4, rel=0.03), ratio


@pytest.fixture(scope="module")
def fedavg_estimate():
    config = RunConfig(algorithm="fedavg", dataset="synthetic", clients=10,
                       clients_per_round=4, rounds=3, eval_every=1, fast_paths="off")
    return estimate_run(config)


def test_a_rounds_matmuls_are_its_clients_local_steps_by_hand(fedavg_estimate):
    e = fedavg_estimate
    steps = client_loop_trips(load_dataset(e.config))(steps_key(e.config))
    # MCLR 60 -> 10, B = 10: a step's forward x @ W and backward x^T @ g, 2 * B * 60 * 10 each
    by_hand = e.clients_per_round * steps * 2 * (2 * 10 * 60 * 10)
    assert by_hand <= e.program("round").cost.matmul_flops <= 1.01 * by_hand
    assert [p.calls for p in e.programs] == [1, 3, 3]  # init, 3 rounds, evaluated each round
    assert e.run_cost.flops == pytest.approx(sum(p.cost.flops * p.calls for p in e.programs))
    assert all(p.footprint and p.footprint > 0 for p in e.programs)
    assert e.params == 610 and e.store.startswith("device")


def test_the_bound_is_the_larger_of_compute_and_memory_time(fedavg_estimate):
    e = fedavg_estimate
    cost = e.program("round").cost
    slow_memory = Target("fake", "", 1, 1e12, 1e12, 1e12, 1.0, 1e12, "")
    bound = bound_on(e, slow_memory)
    assert bound.limit == "memory" and bound.round_seconds == pytest.approx(cost.bytes)
    slow_matmul = Target("fake", "", 2, 1.0, 1e12, 1e12, 1e15, 1e12, "")
    bound = bound_on(e, slow_matmul)
    assert bound.limit == "matmul" and bound.round_seconds == pytest.approx(
        cost.matmul_flops / 2)  # clients dealt over 2 devices
    assert bound_on(e, slow_matmul, "bfloat16").round_seconds < bound.round_seconds
    tiny_memory = Target("fake", "", 1, 1e12, 1e12, 1e12, 1e12, 1e3, "")
    assert bound_on(e, tiny_memory).fits is False and bound_on(e, TARGETS["t4"]).fits


def test_devices_are_matched_to_their_targets():
    assert for_device(jax.devices()[0]) == "cpu-here"

    class Gpu:
        platform, device_kind = "gpu", "NVIDIA H200"
    assert for_device(Gpu()) == "h200"


def test_mcfl_plan_prints_the_run_and_its_targets(capsys):
    argv = ["plan", "--dataset", "synthetic", "--clients", "10", "--rounds", "2",
            "--no-cache", "--target", "t4,tpu-v2-8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "fedavg on synthetic" in out and "610 parameters" in out
    assert "\nt4 " in out and "\ntpu-v2-8 " in out and "cpu-here" not in out
    assert main(argv + ["--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document["targets"]) == {"t4", "tpu-v2-8"}
    assert document["programs"]["round"]["calls"] == 2
    assert document["targets"]["tpu-v2-8"]["devices"] == 8


def test_an_unknown_target_is_one_line_and_exit_2(capsys):
    assert main(["plan", "--dataset", "synthetic", "--clients", "10", "--target", "v100"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'v100'" in err and "h100-80" in err


def test_cost_adds_and_scales():
    assert Cost(1, 1, 2, 1) + Cost(2, 0, 1, 0) == Cost(3, 1, 3, 1)
    assert Cost(1, 1, 2, 1).times(3) == Cost(3, 3, 6, 1)


def test_a_run_on_a_disk_store_is_planned_with_its_store(capsys):
    argv = ["plan", "--algorithm", "local", "--dataset", "synthetic", "--clients", "10",
            "--rounds", "2", "--client-store", "disk", "--no-cache", "--target", "t4", "--json"]
    assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["store"].startswith("disk") and document["stored_bytes"] == 10 * 610 * 4
    assert document["programs"]["round"]["flops"] > 0


def test_a_run_whose_data_cannot_fit_is_planned_from_its_config_alone(tmp_path, monkeypatch,
                                                                       capsys):
    """`mcfl plan` sizes the data from the config before building anything: for data that
    cannot fit it prints their estimate against the memory here and on each target, and
    refuses as `mcfl run` does (the same line, exit code 2), instead of an out-of-memory
    error after a long build. (The commands take the limit from MCFL_MEMORY_LIMIT, the
    library calls from `memory.limited`.)"""
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "1G")

    def built(*args, **kwargs):
        raise AssertionError("mcfl plan built the data or the programs")

    for module, name in ((plan_command, "estimate_run"), (plan_command, "measure_cpu"),
                         (runner, "load_data")):
        monkeypatch.setattr(module, name, built)
    argv = ["plan", "--clients", "100000000", "--no-cache", "--target", "cpu-here,h200"]
    assert main(argv) == 2
    planned = capsys.readouterr()
    with memory.limited("1G"):
        fit = memory.data_fit(mcfl.resolve(RunConfig(clients=100_000_000)).data)
    assert not fit.fits and fit.host > 10**12  # terabytes: Synthetic's mean client has ~450 rows
    lines = planned.out.splitlines()
    assert lines[0].startswith("fedavg on synthetic: 100,000,000 clients")
    assert f"{fit.need.device / 1e12:.3g} TB on the device" in lines[1]
    assert f"needs {fit.host / 1e12:.3g} TB of host memory, 1.07 GB available" in lines[2]
    assert "does NOT fit" in lines[2]
    rows = {line.split()[0]: line.split() for line in lines[5:7]}
    assert rows["cpu-here"][-2:] == ["GB", "NO"] and rows["h200"][-3:] == ["141", "GB", "NO"]
    assert planned.err.startswith("mcfl: error: synthetic with 100,000,000 clients needs about")
    assert planned.err.count("\n") == 1
    # the estimate and the refusal are mcfl run's own
    assert main(["run", "--clients", "100000000", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == planned.err == f"mcfl: error: {fit.problem}\n"
    assert main(argv + ["--json"]) == 2
    document = json.loads(capsys.readouterr().out)
    assert document["error"] == fit.problem and document["here"]["fits"] is False
    assert document["data_bytes"] == fit.need.device
    assert document["targets"]["h200"] == {
        "devices": 1, "need_bytes": fit.need.device, "memory_bytes": 141e9, "fits": False,
        "source": TARGETS["h200"].source}
    assert document["targets"]["cpu-here"]["memory_bytes"] == 2**30


def test_estimate_run_refuses_data_too_large_before_building_them(monkeypatch):
    """`estimate_run` (mcfl plan's library call) refuses data too large as `mcfl.run` does,
    before loading them."""
    monkeypatch.setattr(runner, "load_data", lambda *a: pytest.fail("data were built"))
    refused = "synthetic with 100,000 clients needs about"
    with memory.limited("1M"), pytest.raises(McflError, match=refused):
        estimate_run(RunConfig(clients=100_000), compile=False)
