"""mcfl.sweep: members equal single runs, one compilation per group, grouping, tables, CLI."""

import json
import math

import numpy as np
import pytest
from scipy import stats

import mcfl
from mcfl import load_dataset
from mcfl.apps.cli import main
from mcfl.errors import ConfigError
from mcfl.sweeps.spec import check_grid, expand, group, parse_grid, parse_seeds, traceable_keys

BASE = mcfl.RunConfig(dataset="synthetic", clients=12, clients_per_round=4, rounds=3,
                      batch_size=10, eval_every=2, embed_clients=0)
COMPARED = ("train_loss", "accuracy_micro", "accuracy_macro", "f1_micro", "models_up",
            "cluster_ari")


@pytest.fixture(scope="module")
def dataset():
    return load_dataset(BASE)


def assert_member_equals_run(result, member, dataset, config):
    """Member `member`'s rounds equal `mcfl.run` of its own config."""
    row = result.members[member]
    single = mcfl.run(config.replace(seed=row["seed"], data_seed=row["data_seed"],
                                     **{k: row[k] for k in result.point_names}),
                      dataset=dataset)
    swept = [r for r in result.rounds if r["member"] == member]
    assert [r["round"] for r in swept] == [r["round"] for r in single.rounds]
    for got, want in zip(swept, single.rounds):
        assert set(want) - {"seconds"} <= set(got)
        for key in COMPARED:
            if key in want:
                np.testing.assert_allclose(got[key], want[key], rtol=2e-4, atol=2e-5,
                                           err_msg=f"member {member} round {got['round']} {key}")
        if "cluster_sizes" in want:
            assert got["cluster_sizes"] == want["cluster_sizes"]


@pytest.mark.parametrize("name, config, grid", [
    ("fedavg", BASE.replace(algorithm="fedavg"), {"lr": [0.01, 0.05]}),
    ("fesem", BASE.replace(algorithm="fesem", clusters=2), {"fesem_lambda": [0.0, 0.1]}),
    ("flexcfl", BASE.replace(algorithm="flexcfl", clusters=2, pretrain_scale=2),
     {"eta_g": [0.0, 0.2]}),
])
def test_every_member_equals_its_single_run(name, config, grid, dataset):
    result = mcfl.sweep(config, seeds=[0, 3], grid=grid, dataset=dataset)
    assert len(result.members) == 4 and len(result.groups) == 1
    assert result.groups[0]["traced"] == list(grid)  # one program over values and seeds
    # members: (value 0, seed 0), (value 0, seed 3), (value 1, seed 0), (value 1, seed 3)
    assert [(m[list(grid)[0]], m["seed"]) for m in result.members] == [
        (v, s) for v in list(grid.values())[0] for s in (0, 3)]
    # FedAvg: a seed other than the first, then a value other than the first; the clustered
    # two (each single run compiles its own programs): the member that differs in both
    for member in (1, 2) if name == "fedavg" else (3,):
        assert_member_equals_run(result, member, dataset, config)


def test_one_compilation_per_group_whatever_the_rounds_and_chunks(monkeypatch, dataset,
                                                                  wrap_algorithm):
    """The algorithm's round is traced a fixed number of times per group, the same for 2 or
    4 rounds and for 1 or 2 chunks of members: rounds and chunks reuse compiled programs."""
    built = []

    def counted(algorithm):

        def round_(*a):
            built.append(1)  # runs only when jax traces the round
            return algorithm.round(*a)

        return algorithm._replace(round=round_)

    wrap_algorithm(counted)

    def traces(rounds, chunk):
        built.clear()
        result = mcfl.sweep(BASE.replace(rounds=rounds, eval_every=1), seeds=3,
                            grid={"lr": [0.01]}, dataset=dataset, members_per_chunk=chunk)
        assert [g["members_per_chunk"] for g in result.groups] == [chunk or 3]
        return len(built)

    counts = {traces(2, None), traces(4, None), traces(4, 2)}
    assert len(counts) == 1, counts


def test_shape_changing_values_make_groups_traced_ones_do_not():
    members = expand(BASE.replace(algorithm="fesem"), (0, 1),
                     {"clusters": [2, 3], "lr": [0.01, 0.02], "fesem_lambda": [0.0, 0.1]})
    groups = group(members)
    assert len(members) == 16 and len(groups) == 2
    assert [len(g.members) for g in groups] == [8, 8]
    assert all(g.traced == ("lr", "fesem_lambda") for g in groups)
    assert {m.config.clusters for m in groups[1].members} == {3}
    # algorithms, data seeds and static floats split too
    assert len(group(expand(BASE, (0,), {"algorithm": ["fedavg", "fedprox"]}))) == 2
    assert len(group(expand(BASE, (0,), {}, data_seeds=(0, 1)))) == 2
    assert len(group(expand(BASE, (0,), {"weight_decay": [0.0, 1e-4]}))) == 2
    assert "weight_decay" not in traceable_keys(BASE)
    assert "test_fraction" not in traceable_keys(BASE)  # shapes the data
    assert "lr" in traceable_keys(BASE) and "shift_prob" in traceable_keys(BASE)


@pytest.mark.parametrize("grid, message", [
    ({"learning_rate": [0.1]}, "unknown sweep parameter 'learning_rate'; allowed: algorithm"),
    ({"lr": []}, "grid lr has no values"),
    ({"lr": 0.1}, "grid lr must be a list of values, got 0.1"),
    ({"lr": ["fast"]}, "lr must be a finite number, got 'fast'"),
    ({"lr": [float("nan")]}, "lr must be a finite number, got nan"),
    ({"clients": [2.5]}, "clients must be an integer"),
    ({"seed": [1, 2]}, "seed is varied by the sweep's seeds argument"),
    ({"mu": [0.1]}, "mu applies to fedprox, feddane, not 'fedavg'"),
])
def test_bad_grids_are_config_errors(grid, message):
    with pytest.raises(ConfigError) as e:
        expand(BASE, (0,), check_grid(grid))
    assert message in str(e.value)


def test_seed_lists():
    assert parse_seeds("0-3") == (0, 1, 2, 3)
    assert parse_seeds("0,5,7") == (0, 5, 7)
    assert parse_seeds(3) == (0, 1, 2)
    for bad in ("a-b", "", 0, [1, 1], [-1]):
        with pytest.raises(ConfigError):
            parse_seeds(bad)
    assert parse_grid("lr=0.01,0.05") == ("lr", (0.01, 0.05))
    assert parse_grid("hidden=200,200;100") == ("hidden", ((200, 200), (100,)))
    assert parse_grid("algorithms=fedavg,fesem") == ("algorithm", ("fedavg", "fesem"))
    assert parse_grid("scan-rounds=on,off") == ("scan_rounds", ("on", "off"))
    assert parse_grid("dp-clip-per-layer=true,false") == ("dp_clip_per_layer", (True, False))


def test_tables_and_files(tmp_path, dataset):
    out = tmp_path / "sweep"
    result = mcfl.sweep(BASE.replace(algorithm="fedprox"), seeds="0-2",
                        grid={"mu": [0.0, 0.5]}, dataset=dataset, out_dir=out)
    for name in ("members.csv", "rounds.csv", "summary.csv", "sweep.json", "curves.png"):
        assert (out / name).stat().st_size > 0
    spec = json.loads((out / "sweep.json").read_text())
    assert spec["status"] == "completed" and spec["seeds"] == [0, 1, 2]
    assert spec["grid"] == {"mu": [0.0, 0.5]} and spec["members"] == 6
    # rounds: every member's every round; members: final = last evaluated round
    assert len(result.rounds) == 6 * BASE.rounds
    for m in result.members:
        evaluated = [r for r in result.rounds if r["member"] == m["member"]
                     and "accuracy_micro" in r]
        assert [r["round"] for r in evaluated] == [2, 3]
        assert m["final_accuracy_micro"] == evaluated[-1]["accuracy_micro"]
        assert m["best_accuracy_micro"] == max(r["accuracy_micro"] for r in evaluated)
    # summary: mean, sample std and t interval over the point's three seeds
    assert [row["mu"] for row in result.summary] == [0.0, 0.5]
    for row in result.summary:
        finals = [m["final_accuracy_micro"] for m in result.members if m["mu"] == row["mu"]]
        mean, std = np.mean(finals), np.std(finals, ddof=1)
        half = stats.t.ppf(0.975, 2) * std / math.sqrt(3)
        assert row["completed"] == 3
        assert row["final_accuracy_micro_mean"] == pytest.approx(mean)
        assert row["final_accuracy_micro_std"] == pytest.approx(std)
        assert row["final_accuracy_micro_ci95_low"] == pytest.approx(mean - half)
        assert row["final_accuracy_micro_ci95_high"] == pytest.approx(mean + half)
    frames = result.frames()
    assert list(frames["summary"]["mu"]) == [0.0, 0.5]
    assert len(frames["rounds"]) == len(result.rounds)
    # mcfl compare reads the sweep folder as one entry per grid point
    assert main(["compare", "--runs", str(out), "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").is_file()


def test_a_diverging_member_does_not_stop_the_others(dataset):
    result = mcfl.sweep(BASE, seeds=[0], grid={"lr": [0.01, 1e30]}, dataset=dataset)
    statuses = [m["status"] for m in result.members]
    assert statuses == ["completed", "diverged"]
    assert result.summary[0]["completed"] == 1 and result.summary[1]["completed"] == 0
    assert all(math.isfinite(r["train_loss"]) for r in result.rounds)


def test_cli_sweep_writes_tables(tmp_path, capsys):
    out = tmp_path / "s"
    code = main(["sweep", "--dataset", "synthetic", "--clients", "12", "--rounds", "2",
                 "--clients-per-round", "4", "--seeds", "0-1", "--grid", "lr=0.01,0.05",
                 "--algorithms", "fedavg,fedprox", "--embed-clients", "0", "--no-cache",
                 "--no-compile-cache", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "algorithm=fedprox, lr=0.05" in printed and "8 members in 2 group(s)" in printed
    summary = (out / "summary.csv").read_text().splitlines()
    assert summary[0].startswith("algorithm,lr,members,completed")
    assert len(summary) == 1 + 4


@pytest.mark.parametrize("argv, message", [
    (["--grid", "learning_rate=0.1"], "unknown sweep parameter 'learning_rate'; allowed: "),
    (["--grid", "lr="], "grid lr has no values"),
    (["--grid", "lr=fast"], "grid lr: 'fast' is not a number"),
    (["--grid", "clients=ten"], "grid clients: 'ten' is not an integer"),
    (["--grid", "lr"], "--grid must look like NAME=V1,V2, got 'lr'"),
    (["--grid", "lr=0,0.1"], "lr must be a number > 0, got 0.0"),
    (["--seeds", "0-x"], "seeds must look like 0-7 or 0,3,5, got '0-x'"),
    (["--algorithms", "fedavg,magic"], "unknown algorithm 'magic'"),
])
def test_cli_bad_grid_is_one_line_exit_2(argv, message, capsys, tmp_path):
    code = main(["sweep", "--clients", "12", "--rounds", "1", "--no-cache",
                 "--out", str(tmp_path / "x"), *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
