"""Every setting used or refused: a config resolved once into what will run (`mcfl.resolve`).

The generated matrix (tests/settings_matrix.py: every algorithm x every setting moved off its
default, in the contexts that switch a rule on) finds no setting accepted and ignored; a sample
of its pairs, and every pair the issue's defects came from, shows that a different plan is a
different run; and each defect is checked where it was: the clock with availability, trace
intervals, asynchronous servers and round sampling, rounds nobody reported, checkpoints under
scanned rounds, DP on a sweep's grid, and the one-line refusals."""

from __future__ import annotations

import csv
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
import settings_matrix

import mcfl
from mcfl.algorithms.framework import registry
from mcfl.apps.cli import main
from mcfl.errors import ConfigError
from mcfl.runs.loop import RoundChunks
from mcfl.runs.runner import chunk_note
from mcfl.system.clock import synchronous_round
from mcfl.system.devices import Profile, SystemModel, parse_availability

TINY = dict(dataset="synthetic", clients=20, clients_per_round=5, rounds=3, local_steps=2,
            model="mclr", seed=0)


def _refused(argv, capsys) -> str:
    """Run the command line in process: exit 2 and one line on stderr, which is returned."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("mcfl: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    trace = settings_matrix.trace_file(tmp_path_factory.mktemp("trace"))
    return settings_matrix.matrix(shared_contexts=settings_matrix.SHARED_CONTEXT_ALGORITHMS,
                                  trace=trace)


def test_no_setting_of_any_algorithm_is_accepted_and_ignored(matrix):
    """Every registered algorithm x every setting moved off its default (and, for one
    algorithm of each family, in every rule-switching context): refused in one line naming
    the flag, or a plan other than the base's. Each setting of each algorithm is tried."""
    ignored = [o for o in matrix if o.result == "ignored"]
    assert ignored == []
    tried = {(o.algorithm, o.key) for o in matrix}
    for name in mcfl.algorithms.names():
        want = {(name, key) for key in settings_matrix.setting_fields(name)}
        assert want <= tried, sorted(want - tried)
    counts = settings_matrix.counts(matrix)
    assert counts["used"] > 5000 and counts["refused"] > 3000
    for o in matrix:
        if o.result == "refused":
            assert "\n" not in o.why, o


def test_the_matrix_sees_an_ignored_setting(monkeypatch):
    """The check itself: a setting dropped before it reaches the plan (the shift's chance,
    resolved as if never given) is found as ignored."""
    from mcfl.runs import plan as plan_module

    original = plan_module._shift
    monkeypatch.setattr(plan_module, "_shift", lambda config, refuse: original(
        config.replace(shift_prob=0.05), plan_module._Refuser(config.replace(shift_prob=0.05))))
    found = settings_matrix.matrix(["fedavg"], ("fedavg",))
    ignored = {(o.context, o.key) for o in found if o.result == "ignored"}
    assert ("swap_all", "shift_prob") in ignored and {key for _, key in ignored} == {
        "shift_prob"}


# (flat changes from TINY, with the algorithm): pairs whose plans differ from the base's; a run
# of each differs from the base run in its rows or summary beyond summation order. The first
# come from the matrix's sample, the rest from the issue's defects.
DIFFERENT_RUNS = [
    ("fedavg", {"server_lr": 0.5}),
    ("fedprox", {"mu": 0.5}),
    ("ifca", {"clusters": 2}),
    ("fedavg", {"client_optimizer": "momentum", "momentum": 0.5}),
    ("fedavg", {"weight_decay": 0.01, "weight_decay_on": "kernels"}),
    ("fedavg", {"shift": "swap_all", "shift_prob": 0.9}),
    ("fedavg", {"synthetic_beta": 0.5}),
    ("fedbuff", {"staleness": "hinge", "staleness_b": 0.0}),
    ("fedbuff", {"concurrency": 4, "buffer_size": 2}),
    ("fedavg", {"availability": "diurnal:100,0.2"}),
    ("fedavg", {"client_dropout": 0.5}),
]


@pytest.mark.parametrize("algorithm, changes", DIFFERENT_RUNS)
def test_a_different_plan_is_a_different_run(algorithm, changes):
    settings = {**TINY, **({"clusters": 3} if algorithm == "ifca" else {}),
                # (an asynchronous server samples no round)
                **({"clients_per_round": None} if registry.get(algorithm).asynchronous
                   else {})}
    base = mcfl.RunConfig(algorithm=algorithm, **settings)
    moved = base.replace(**changes)
    assert mcfl.resolve(moved) != mcfl.resolve(base)
    a, b = mcfl.run(base), mcfl.run(moved)
    keys = ("train_loss", "test_loss", "accuracy_micro", "sim_time")
    rows_a = [[r.get(k) for k in keys] for r in a.rounds]
    rows_b = [[r.get(k) for k in keys] for r in b.rounds]
    differ = any(x != y and not (x is not None and y is not None and math.isclose(
        x, y, rel_tol=1e-5)) for ra, rb in zip(rows_a, rows_b) for x, y in zip(ra, rb))
    assert differ, (algorithm, changes)


def test_the_clock_moves_on_when_the_sampled_clients_go_offline():
    """A round whose every client goes offline before it finishes lasts until the last of them
    does (the server hears of it then): the clock moves, so the next round samples others.
    Before, such a round took 0 s and the run sampled the same clients forever."""
    profile = Profile(jnp.ones(2), jnp.full((2,), jnp.inf), jnp.zeros(2),
                      jnp.asarray([[[0.0, 5.0]], [[0.0, 3.0]]]), jnp.asarray([1, 1]), 100.0)
    timing = synchronous_round(SystemModel(availability=parse_availability("trace:100")),
                               profile, jnp.asarray([0, 1]), jnp.ones(2), jnp.asarray([8, 8]),
                               0.0, 0.0, 0.0, None, 2)
    np.testing.assert_array_equal(timing.present, [0, 0])
    assert float(timing.seconds) == pytest.approx(5.0)


def test_diurnal_availability_without_device_speeds_trains():
    """--availability diurnal:100,0.2 alone (1 step a second): the clock advances, clients
    report, and the model trains (it stayed at its initial accuracy in every round)."""
    config = mcfl.RunConfig(algorithm="fedavg", **{**TINY, "rounds": 6},
                            availability="diurnal:100,0.2")
    result = mcfl.run(config)
    assert result.rounds[-1]["sim_time"] > 0
    assert sum(r["clients_reported"] for r in result.rounds) > 0
    first, last = result.rounds[0]["test_loss"], result.rounds[-1]["test_loss"]
    assert last < first


def test_a_run_no_client_can_ever_report_in_is_refused(capsys):
    """Every client online 2 s of every 100 and needing 10 s for a round: refused before it
    runs, saying why."""
    err = _refused(["run", "--clients", "10", "--rounds", "2", "--local-steps", "10",
                    "--availability", "diurnal:100,0.02", "--no-cache"], capsys)
    assert "no client can ever report" in err and "--availability diurnal:100,0.02" in err


def test_trace_intervals_without_the_availability_flag_are_refused(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text("client,speed,bandwidth,online\n"
                     + "".join(f"{c},2,10,0-50\n" for c in range(10)))
    err = _refused(["run", "--clients", "10", "--rounds", "1", "--device-trace", str(trace),
                    "--out", str(tmp_path / "run")], capsys)
    assert "gives online intervals; give --availability trace:PERIOD" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, named", [
    (["--clients-per-round", "3"], "--clients-per-round 3 chooses a synchronous round's"),
    (["--client-sampling", "round_robin_first"], "--client-sampling round_robin_first"),
])
def test_an_asynchronous_server_refuses_round_sampling(flags, named, capsys):
    err = _refused(["run", "--algorithm", "fedbuff", "--clients", "20", *flags], capsys)
    assert named in err and "fedbuff's server never waits for a round" in err


def test_rounds_nobody_reported_in_have_no_training_loss(tmp_path):
    """--client-dropout 0.999: rounds in which no client reported write no train_loss (an empty
    cell, None in the rows), not 0; the plots skip them."""
    config = mcfl.RunConfig(algorithm="fedavg", **TINY, client_dropout=0.999)
    result = mcfl.run(config, out_dir=tmp_path / "run")
    silent = [r for r in result.rounds if r["clients_reported"] == 0]
    assert silent and all(r["train_loss"] is None and r["discrepancy"] is None
                          for r in silent)
    with open(tmp_path / "run" / "rounds.csv") as f:
        cells = [row["train_loss"] for row in csv.DictReader(f)]
    assert cells.count("") == len(silent)
    assert (tmp_path / "run" / "curves.png").is_file()


@pytest.mark.parametrize("changes, named", [
    ({"dataset": "digits", "synthetic_alpha": 5.0}, "--synthetic-alpha 5.0 does not apply"),
    ({"algorithm": "fedbuff", "staleness": "polynomial", "staleness_b": 9.0},
     "--staleness-b 9.0 is a parameter of the staleness function"),
    ({"algorithm": "fedbuff", "staleness": "constant", "staleness_a": 3.0},
     "--staleness-a 3.0 is a parameter"),
    ({"shift": "incremental", "shift_prob": 0.7}, "--shift-prob 0.7"),
    ({"momentum": 0.5}, "--momentum 0.5 is the momentum of --client-optimizer momentum"),
    ({"deadline_policy": "drop"}, "--deadline-policy drop"),
    ({"clusters": 3}, "--clusters 3 is K of a clustered algorithm"),
    ({"over_select": 10.0}, "--over-select 10"),
    ({"over_select": 0.3, "clients_per_round": None}, "more than the 20 clients"),
    ({"algorithm": "fesem", "client_sampling": "poisson"},
     "--client-sampling poisson runs with the algorithms"),
])
def test_settings_that_do_not_apply_are_refused_naming_the_flag(changes, named):
    config = mcfl.RunConfig(**{**TINY, "algorithm": "fedavg", **changes})
    with pytest.raises(ConfigError) as raised:
        mcfl.resolve(config)
    assert named in str(raised.value) and "\n" not in str(raised.value)


def test_scanned_rounds_end_their_chunks_at_checkpoint_rounds(tmp_path, monkeypatch):
    """--checkpoint-every 2 on a run whose 6 rounds are scanned to one evaluation: chunks of
    2 rounds, and a checkpoint after each (before: one chunk of 6 and one checkpoint)."""
    assert list(RoundChunks(6, 50, True, 2)) == [(1, 2), (3, 2), (5, 2)]
    assert list(RoundChunks(250, 50, True, 1))[:3] == [(1, 1), (2, 1), (3, 1)]
    assert RoundChunks(250, 50, True, 1).evaluations == 5
    assert list(RoundChunks(7, 3, True, 2).after(4)) == [(5, 2), (7, 1)]
    saved = []
    from mcfl.files import checkpoint

    original = checkpoint.Checkpoints.save
    monkeypatch.setattr(checkpoint.Checkpoints, "save", lambda self, r, *a: (
        saved.append(r), original(self, r, *a)))
    config = mcfl.RunConfig(algorithm="fedavg", **{**TINY, "rounds": 6}, eval_every=50,
                            scan_rounds="on")
    result = mcfl.run(config, out_dir=tmp_path / "run", checkpoint_every=2)
    assert saved == [2, 4, 6]
    assert not any("--checkpoint-every" in note for note in result.summary["notes"])
    # a cadence beside the evaluation's: chunks end at 3, 5, 6, 9, 10, 12 (three lengths, a
    # compilation each), said in a note
    chunks = RoundChunks(12, 5, True, 3)
    assert chunks.lengths() == {1: 2, 2: 2, 3: 2}
    assert chunk_note(mcfl.resolve(config.replace(eval_every=5), checkpoint_every=3),
                      chunks.lengths()) == (
        "--checkpoint-every 3 beside --eval-every 5 cuts the scanned rounds into chunks of 3 "
        "lengths (1, 2, 3), each compiled once; a cadence that divides 5 or is a multiple of "
        "it gives at most 2")


def _members(folder) -> list[dict]:
    with open(folder / "members.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_synthetic_alpha_changes_no_label_and_is_refused():
    """Synthetic(alpha, beta) draws a client's W and b about one mean u_k ~ N(0, alpha): every
    class's logit moves by u_k (sum(x) + 1), so the labels are the same for any alpha (here
    0.5 and 3 against 1, on 20 clients' ~3,000 rows); --synthetic-alpha is refused, beta
    is used."""
    from mcfl.data import generate_synthetic

    labels = [np.asarray(generate_synthetic(20, alpha, 1.0, 0).arrays.y_train)
              for alpha in (1.0, 0.5, 3.0)]
    np.testing.assert_array_equal(labels[0], labels[1])
    np.testing.assert_array_equal(labels[0], labels[2])
    moved = np.asarray(generate_synthetic(20, 1.0, 0.5, 0).arrays.y_train)
    assert moved.shape != labels[0].shape or (moved != labels[0]).any()
    with pytest.raises(ConfigError, match="--synthetic-alpha 0.5 does not apply to --dataset "
                                          "synthetic: .* changes no label"):
        mcfl.resolve(mcfl.RunConfig(**TINY, synthetic_alpha=0.5))


def test_dp_on_a_sweeps_grid_switches_it_on(capsys, tmp_path):
    """--grid dp_noise=... with --dp-clip and no --dp-noise (the privacy guide's command):
    each member is its own run, DP on at its noise; --grid dp_epsilon too."""
    common = ["sweep", "--clients", "20", "--rounds", "2", "--local-steps", "2",
              "--dp-clip", "1", "--seeds", "0", "--no-cache"]
    assert main([*common, "--grid", "dp_noise=0.7,2", "--out", str(tmp_path / "noise")]) == 0
    members = _members(tmp_path / "noise")
    assert [float(m["dp_noise"]) for m in members] == [0.7, 2.0]
    epsilons = [float(m["dp_epsilon"]) for m in members]
    assert epsilons[0] > epsilons[1] > 0
    assert main([*common, "--grid", "dp_epsilon=2,8", "--out", str(tmp_path / "eps")]) == 0
    spent = [float(m["dp_epsilon"]) for m in _members(tmp_path / "eps")]
    assert spent == pytest.approx([2.0, 8.0], rel=0.05)


@pytest.mark.parametrize("argv, named", [
    (["run", "--partition", "dirichlet:inf", "--dataset", "digits"], "dirichlet alpha must be"),
    (["run", "--partition", "shards:99999999999", "--dataset", "digits"], "shards needs a count"),
    (["plan", "--rounds", "1000000000"], "--rounds 1,000,000,000 would keep about"),
    (["run", "--rounds", "10000000"], "--rounds 10,000,000 would keep about"),
    (["select-k", "--algorithm", "fesem", "--k", "2,3", "--tolerance", "-1"],
     "--tolerance must be a finite accuracy gap >= 0"),
])
def test_bad_values_are_one_line_before_anything_is_built(argv, named, capsys, tmp_path,
                                                          monkeypatch):
    monkeypatch.setenv("MCFL_MEMORY_LIMIT", "8G")
    from mcfl.runs import runner

    monkeypatch.setattr(runner, "load_data", lambda *a: pytest.fail("data were built"))
    err = _refused([*argv, "--out", str(tmp_path / "out")] if argv[0] != "plan" else argv,
                   capsys)
    assert named in err, err


@pytest.mark.parametrize("source, named", [
    ("def f(:\n", "does not parse: invalid syntax"),
    ("x = undefined_name\n", "failed: NameError: name 'undefined_name' is not defined"),
    ("raise RuntimeError('boom')\n", "failed: RuntimeError: boom"),
])
@pytest.mark.parametrize("flag", ["--model", "--dataset"])
def test_a_users_module_that_fails_on_import_is_one_line(source, named, flag, tmp_path,
                                                          monkeypatch, capsys):
    (tmp_path / "broken_module.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    err = _refused(["run", flag, "broken_module:f", "--rounds", "1"], capsys)
    assert named in err and "broken_module:f" in err


def test_the_unseen_share_names_itself_and_says_its_rounding(capsys):
    """--unseen-share 0.99 leaving too few clients for --clients-per-round names the share;
    0.25 of 40 clients in 4 groups holds out 8 (round(2.5) of each group is 2), and says
    so."""
    base = ["run", "--dataset", "digits", "--partition", "permuted:4", "--clients", "40",
            "--rounds", "1", "--no-cache"]
    err = _refused([*base, "--unseen-share", "0.99", "--clients-per-round", "10"], capsys)
    assert err.startswith("mcfl: error: --unseen-share 0.99 holds 36 of the 40 clients")
    config = mcfl.RunConfig(dataset="digits", partition="permuted:4", clients=40, rounds=1,
                            unseen_share=0.25)
    result = mcfl.run(config)
    assert result.summary["dataset"]["unseen_clients"] == 8
    assert result.summary["notes"] == [
        "--unseen-share 0.25 holds out 8 of the 40 clients (round(0.25 x n) of each of the 4 "
        "planted groups of n clients): a share of 0.2"]


def test_run_json_records_the_resolved_plan_and_mcfl_plan_prints_it(tmp_path, capsys):
    config = mcfl.RunConfig(algorithm="ifca", **TINY, clusters=2)
    mcfl.run(config, out_dir=tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    plan = mcfl.resolve(config)
    assert saved["plan"] == json.loads(json.dumps(plan.describe()))
    assert saved["plan"]["data"]["test_fraction"] == 0.1  # Synthetic's, filled in
    assert saved["plan"]["participation"]["per_round"] == 5
    assert main(["plan", "--algorithm", "ifca", "--clusters", "2", "--clients", "20",
                 "--rounds", "3", "--no-cache", "--target", "cpu-here"]) == 0
    out = capsys.readouterr().out
    assert "the resolved plan" in out and "algorithm      name=ifca" in out


def test_boolean_flags_are_documented_in_both_forms():
    from mcfl.algorithms.framework import registry
    from mcfl.config import markdown_table

    assert "`--apfl-adaptive` / `--no-apfl-adaptive` (on)" in registry.markdown_table()
    assert "`--download` / `--no-download`" in markdown_table()


def test_a_natural_datasets_plan_is_resolved_again_with_its_users():
    """A plan whose clients are counted when the data are loaded (leaf's users) is resolved
    again with them: a K above the users is refused then, naming both."""
    plan = mcfl.resolve(mcfl.RunConfig(algorithm="ifca", dataset="leaf", data_dir="leafdata",
                                       clusters=4, rounds=1))
    assert plan.data.clients is None and plan.participation.per_round is None
    assert plan.with_clients(30).participation.per_round == 20
    with pytest.raises(ConfigError, match=r"--clusters 4 \(K\) cannot exceed the number of "
                                          r"clients \(3\)"):
        plan.with_clients(3)
