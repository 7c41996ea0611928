"""The papers' scoring rule and `mcfl reproduce` (on a tiny form of a table)."""

import json
from pathlib import Path

import numpy as np
import pytest

from mcfl import reproduce
from mcfl.apps.cli import main
from mcfl.config import load_file
from mcfl.errors import ConfigError
from mcfl.runner import cluster_metrics, paper_score


def test_paper_score_counts_only_rounds_with_every_client_in_a_group():
    rows = [{"round": 1}, {"round": 5, "accuracy_micro": 0.9, "clients_waiting": 3},
            {"round": 10, "accuracy_micro": 0.7, "clients_waiting": 0},
            {"round": 15, "accuracy_micro": 0.8, "clients_waiting": 0},
            {"round": 20, "accuracy_micro": 0.75, "clients_waiting": 0}]
    evaluated = [r for r in rows if "accuracy_micro" in r]
    assert paper_score(evaluated) == 0.8  # mcfl's best would be 0.9, from round 5
    assert paper_score(evaluated[:1]) is None  # a client never joined
    no_groups = [{"accuracy_micro": 0.6}, {"accuracy_micro": 0.65}]
    assert paper_score(no_groups) == 0.65  # every client is in from round 1
    assert cluster_metrics(np.array([0, -1, 1, -1]), None)["clients_waiting"] == 2


def test_every_table_and_cell_is_a_valid_config():
    for name in reproduce.names():
        table = reproduce.get(name)
        for quick in (False, True):
            base = reproduce.base_config(table, quick)
            cells = reproduce.cell_configs(table, base)
            assert len(cells) == len(table.cells)
        # a table compares with the paper's values, or with the ordering it claims
        assert any(c.paper is not None for c in table.cells) or table.ordering
        assert set(table.ordering) <= {c.label for c in table.cells}
        root = Path(__file__).resolve().parent.parent
        assert load_file(root / table.config_file) == {**reproduce.get(name).base}
    table3 = reproduce.get("flexcfl-table3-synthetic")
    base = reproduce.base_config(table3, quick=False)
    assert (base.clients, base.rounds, base.local_epochs, base.clusters, base.lr) == (
        100, 300, 10, 5, 0.01)
    labels = [c.label for c in table3.cells]
    assert labels[:4] == ["FedAvg", "FedProx (mu 1)", "IFCA", "FeSEM"]
    # the experiments/ file a user reads is the table's base setting
    root = Path(__file__).resolve().parent.parent
    assert load_file(root / table3.config_file) == table3.base
    with pytest.raises(ConfigError, match="unknown table 'nope'"):
        reproduce.get("nope")


def test_ordering_line_says_whether_the_means_follow_the_paper():
    rows = [{"cell": "IFCA", "mcfl_mean": 90.0}, {"cell": "global", "mcfl_mean": 80.0},
            {"cell": "local", "mcfl_mean": 85.0}, {"cell": "FeSEM", "mcfl_mean": 70.0}]
    line = reproduce.ordering_line(("IFCA", "global", "local"), rows)
    assert line.endswith("mcfl: IFCA (90.0) > global (80.0) > local (85.0): NOT the same order.")
    assert reproduce.ordering_line(("IFCA", "global"), rows).endswith("the same order.")
    assert "not enough cells" in reproduce.ordering_line(("IFCA", "x"), rows)


def test_a_tiny_table_writes_every_cell_beside_the_paper(tmp_path):
    out = tmp_path / "t3"
    cells = ["FedAvg", "FedProx (mu 1)", "FlexCFL"]
    found = reproduce.run_table(
        "flexcfl-table3-synthetic", out, quick=True, seeds=2, cells=cells,
        overrides={"clients": 40, "rounds": 2, "local_epochs": 1, "clusters": 2,
                   "eval_every": 1})  # the cold start takes pretrain_scale 20 x K = 40
    rows = found["rows"]
    assert [r["cell"] for r in rows] == cells
    for r in rows:
        if r["mcfl_mean"] is not None:
            assert len(r["per_seed"]) == r["seeds_scored"] <= 2
            assert r["mcfl_mean"] == pytest.approx(np.mean(r["per_seed"]), abs=0.01)
            if r["paper"] is not None:
                assert r["difference"] == pytest.approx(r["mcfl_mean"] - r["paper"])
    fedavg = rows[0]
    assert fedavg["seeds_scored"] == 2 and fedavg["settings"] == {"algorithm": "fedavg"}
    assert rows[1]["settings"] == {"algorithm": "fedprox", "mu": 1.0}
    text = (out / "table.md").read_text()
    assert "| FedAvg | 66.9 |" in text and "quick form" in text
    assert (out / "table.png").is_file() and (out / "table.csv").is_file()
    spec = json.loads((out / "reproduce.json").read_text())
    assert spec["status"] == "completed" and spec["seeds"] == [2077, 2078]
    assert (out / "cells" / "fedavg" / "members.csv").is_file()
    with pytest.raises(ConfigError, match="unknown cell 'FedMagic'; allowed: FedAvg"):
        reproduce.run_table("flexcfl-table3-synthetic", tmp_path / "x", cells=["FedMagic"])
    with pytest.raises(Exception, match="already holds a run"):
        reproduce.run_table("flexcfl-table3-synthetic", out, cells=["FedAvg"])


def test_cli_list_and_bad_names(capsys):
    assert main(["reproduce", "--list"]) == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in reproduce.names()) and "--quick" in printed
    assert main(["reproduce", "nope"]) == 2
    assert "unknown table 'nope'; allowed: flexcfl-table3-synthetic" in capsys.readouterr().err
    assert main(["reproduce"]) == 2
    assert main(["reproduce", "flexcfl-table3-synthetic", "--seeds", "0"]) == 2
