"""K selection (FeSEM paper Sec. 5.2) and the clients' 2-D plot (FeSEM Fig. 3)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import planted_gaussian

import mcfl
from mcfl.apps.cli import main
from mcfl.data.federated import subset_clients
from mcfl.errors import ConfigError
from mcfl.runs.select_k import distance_elbow, select_k


def test_distance_elbow_by_hand():
    rows = [{"k": k, "intra_cluster_distance": d}
            for k, d in zip([2, 3, 4, 5, 6], [0.255, 0.242, 0.221, 0.211, 0.200])]
    # drops 0.013, 0.021, 0.010, 0.011: K = 4 cut most more than the next step did
    assert distance_elbow(rows) == 4
    assert distance_elbow(rows[:2]) is None


def test_subset_keeps_the_chosen_clients_rows():
    data = planted_gaussian(20)
    sub = subset_clients(data, [3, 7, 11])
    assert sub.client_ids == tuple(data.client_ids[i] for i in (3, 7, 11))
    np.testing.assert_array_equal(sub.true_cluster, data.true_cluster[[3, 7, 11]])
    a = data.arrays
    for new, old in enumerate((3, 7, 11)):
        off, cnt = int(a.train_offsets[old]), int(a.train_counts[old])
        sub_off = int(sub.arrays.train_offsets[new])
        np.testing.assert_array_equal(
            np.asarray(sub.arrays.x_train[sub_off:sub_off + cnt]),
            np.asarray(a.x_train[off:off + cnt]))


def test_select_k_runs_each_candidate_on_a_sample(tmp_path, capsys):
    data = planted_gaussian(60)
    config = mcfl.RunConfig(algorithm="fesem", clients=60, clients_per_round=1.0, lr=0.1,
                            fesem_restarts=3)
    found = select_k(config, [1, 4, 8], sample=40, rounds=2, dataset=data)
    assert [r["k"] for r in found["rows"]] == [1, 4, 8] and found["sample"] == 40
    assert found["recommended"] in (1, 4, 8) and found["elbow"] == 4
    dist = [r["intra_cluster_distance"] for r in found["rows"]]
    assert dist[0] > dist[1] > dist[2]  # more clusters, closer members
    with pytest.raises(ConfigError, match="select-k needs a clustered algorithm"):
        select_k(config.replace(algorithm="fedavg"), [2], dataset=data)


def test_select_k_refuses_a_sample_above_the_clients():
    """A sample of more clients than the dataset has would sample them all: refused, naming
    the value and the range (the default samples every client of a dataset under 100)."""
    data = planted_gaussian(12)
    config = mcfl.RunConfig(algorithm="fesem", clients=12)
    for sample in (13, 100, 0, 2.5):
        with pytest.raises(ConfigError) as caught:
            select_k(config, [2], sample=sample, dataset=data)
        assert str(caught.value) == (f"--sample must be a number of clients from 1 to the "
                                     f"dataset's 12, got {sample!r}")
    with pytest.raises(ConfigError, match=r"^K = 13 exceeds the 12 sampled clients; allowed: "
                                          r"K up to 12$"):
        select_k(config, [2, 13], dataset=data)  # (the default sample: all 12)


def test_plot_clusters_from_a_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--algorithm", "ifca", "--dataset", "digits", "--partition",
                 "permuted:4", "--clients", "24", "--rounds", "2", "--clients-per-round", "1.0",
                 "--embed-clients", "16", "--out", str(out)]) == 0
    with np.load(out / "clients_pca.npz") as saved:  # (closed: an open one warns later)
        assert saved["coords"].shape == (16, 2) and len(set(saved["clients"])) == 16
        assert set(saved) >= {"cluster", "true_cluster", "explained"}
    assert main(["plot", "clusters", str(out)]) == 0
    assert (out / "clusters.png").stat().st_size > 5000
    assert main(["plot", "clusters", str(tmp_path)]) == 2
    assert "has no clients_pca.npz" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["embed_clients"] == 16
