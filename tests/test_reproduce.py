"""The papers' scoring rule and `mcfl reproduce` (on a tiny form of a table)."""

import json
from pathlib import Path

import numpy as np
import pytest

from mcfl import reproduce
from mcfl.apps.cli import main
from mcfl.config import from_dict, load_file
from mcfl.errors import ConfigError, DataError
from mcfl.runs.records import cluster_metrics, paper_score


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
    root = Path(__file__).resolve().parent.parent
    for name in reproduce.names():
        table = reproduce.get(name)
        for quick in (False, True):
            base = reproduce.base_config(table, quick)
            cells = reproduce.cell_configs(table, base, quick)
            assert len(cells) == len(table.cells_of(quick))
            form = table.form(quick)
            # a table compares with the paper's values, or with the ordering it claims
            assert any(v is not None for c in table.cells_of(quick)
                       for v in c.paper_values(len(table.metrics))) or form.orderings
            labels = {c.label for c in table.cells_of(quick)}
            assert all(set(chain) <= labels for chain in form.orderings)
        # the table's settings are the experiments/ files a user reads (and runs)
        for name_ in table.files():
            settings = load_file(root / "experiments" / f"{name_}.toml")
            assert reproduce.tables.experiment(name_) == settings
            from_dict(settings)
    table3 = reproduce.get("flexcfl-table3-synthetic")
    base = reproduce.base_config(table3, quick=False)
    assert (base.clients, base.rounds, base.local_epochs, base.clusters, base.lr) == (
        100, 300, 10, 5, 0.01)
    labels = [c.label for c in table3.cells]
    assert labels[:4] == ["FedAvg", "FedProx (mu 1)", "IFCA", "FeSEM"]
    fmnist = reproduce.base_config(reproduce.get("flexcfl-table3-fmnist"), quick=True)
    assert fmnist.client_sampling == "round_robin_first"
    assert fmnist.rounds >= 2 * 500 // 20  # the paper's rule scores only after the first pass
    fesem = reproduce.get("fesem-table1")
    assert len(fesem.cells) == 28 and len(fesem.metrics) == 4
    femnist_fedavg = next(c for c in fesem.cells if c.label == "FEMNIST FedAvg")
    assert femnist_fedavg.paper == (84.9, 67.9, 84.9, 45.4)
    with pytest.raises(ConfigError, match="unknown table 'nope'"):
        reproduce.get("nope")



def test_the_table_files_are_the_tables_reproduce_knows():
    folder = Path(__file__).resolve().parent.parent / "experiments" / "tables"
    loaded = reproduce.tables.load_tables(folder)
    assert sorted(loaded) == sorted(p.stem for p in folder.glob("*.toml"))
    assert tuple(loaded) == reproduce.names() and loaded == reproduce.TABLES


# The smallest table file: one cell with the paper's value, one without ("none")
TABLE_FILE = """title = "t"
source = "s"
setting = "flexcfl_table3_synthetic"
position = 1
[full]
changes = {}
seeds = 3
cost = "c"
[quick]
changes = {rounds = 2}
seeds = 1
cost = "c"
[[cells]]
label = "FedAvg"
changes = {algorithm = "fedavg"}
paper = 66.9
[[cells]]
label = "IFCA"
changes = {algorithm = "ifca"}
paper = "none"
"""


def test_a_malformed_table_file_is_refused_naming_the_file_and_the_key(tmp_path):
    (tmp_path / "mine.toml").write_text(TABLE_FILE)
    table = reproduce.tables.load_tables(tmp_path)["mine"]
    assert [c.paper for c in table.cells] == [66.9, None] and table.quick.changes == {"rounds": 2}
    for old, new, key in (
            ('seeds = 3', 'seeds = "3"', "full.seeds must be an integer"),
            ("paper = 66.9", 'paper = "n/a"', "cells[0].paper must be a number"),
            ("paper = 66.9", "paper = [66.9, 1.0]", "cells[0].paper must hold one value"),
            ("[quick]", "sedes = 2\n[quick]", "unknown key full.sedes"),
            ("position = 1\n", "", "missing key position"),
            ('label = "IFCA"', "label = IFCA", "is malformed")):  # not TOML: its line
        assert old in TABLE_FILE
        (tmp_path / "mine.toml").write_text(TABLE_FILE.replace(old, new, 1))
        with pytest.raises(ConfigError) as e:
            reproduce.tables.load_tables(tmp_path)
        assert str(tmp_path / "mine.toml") in str(e.value) and key in str(e.value)
        assert "\n" not in str(e.value)
    (tmp_path / "mine.toml").write_text(TABLE_FILE)
    (tmp_path / "other.toml").write_text(TABLE_FILE)
    with pytest.raises(ConfigError, match="other.toml'?: position 1 is also"):
        reproduce.tables.load_tables(tmp_path)

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
    # an override no chosen cell takes is refused before anything is written
    with pytest.raises(ConfigError, match=r"^--clusters 2 is taken by none of the table's "
                                          r"cells \(fedavg, fedprox\)$"):
        reproduce.run_table("flexcfl-table3-synthetic", tmp_path / "x", quick=True,
                            cells=["FedAvg", "FedProx (mu 1)"], overrides={"clusters": 2})
    assert not (tmp_path / "x").exists()
    with pytest.raises(Exception, match="already holds a reproduced table"):
        reproduce.run_table("flexcfl-table3-synthetic", out, cells=["FedAvg"])


def test_the_baselines_table_reports_accuracy_and_ari_once_each(tmp_path):
    """Two Synthetic cells of clustered-baselines, tiny: one ARI column (a metric of its own
    there), accuracy per cell, the orderings of parts not run said to lack cells."""
    out = tmp_path / "baselines"
    found = reproduce.run_table(
        "clustered-baselines", out, quick=True, seeds=1, cells=["Synthetic FedAvg",
                                                                "Synthetic IFCA"],
        overrides={"clients": 80, "rounds": 2, "clients_per_round": 4, "eval_every": 1})
    assert [r["cell"] for r in found["rows"]] == ["Synthetic FedAvg", "Synthetic IFCA"]
    text = (out / "table.md").read_text()
    assert "| cell | Micro-Acc | ARI | settings |" in text
    assert "not enough cells scored here" in text


def test_cli_list_and_bad_names(capsys):
    assert main(["reproduce", "--list"]) == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in reproduce.names()) and "--quick" in printed
    assert main(["reproduce", "nope"]) == 2
    assert "unknown table 'nope'; allowed: flexcfl-table3-synthetic" in capsys.readouterr().err
    assert main(["reproduce"]) == 2
    assert main(["reproduce", "flexcfl-table3-synthetic", "--seeds", "0"]) == 2


def _write_leaf_part(folder, users: dict) -> None:
    """LEAF JSON train / test files of `users` ({name: (x rows, labels)}), 4 rows of each
    user in train and 1 in test."""
    for split, rows in (("train", slice(0, 4)), ("test", slice(4, 5))):
        (folder / split).mkdir(parents=True)
        doc = {"users": list(users), "num_samples": [len(y[rows]) for _, y in users.values()],
               "user_data": {u: {"x": x[rows], "y": y[rows]} for u, (x, y) in users.items()}}
        (folder / split / "part.json").write_text(json.dumps(doc))


def test_fesem_table1_reads_both_leaf_parts_and_reports_four_metrics(tmp_path, capsys):
    """The full form on tiny LEAF folders (FEMNIST-like rows, CelebA-like image files): every
    cell reads its part's folder (its own model), and is scored on the last round's micro /
    macro accuracy and F1 beside the paper's four values (one seed here; the spread over
    seeds is checked on the Synthetic table above)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    leaf = tmp_path / "leaf" / "data"
    _write_leaf_part(leaf / "femnist" / "data", {
        f"f{u}": (rng.random((5, 784)).round(2).tolist(), [int(v) for v in rng.integers(0, 62, 5)])
        for u in range(3)})
    images = leaf / "celeba" / "data" / "raw" / "img_align_celeba"
    images.mkdir(parents=True)
    people = {}
    for u in range(3):
        names = [f"{u}_{i}.png" for i in range(5)]
        for name in names:
            Image.new("RGB", (6, 6), tuple(int(v) for v in rng.integers(0, 255, 3))).save(
                images / name)
        people[f"c{u}"] = (names, [int(v) for v in rng.integers(0, 2, 5)])
    _write_leaf_part(leaf / "celeba" / "data", people)

    # (MCLR instead of the parts' CNNs: what is checked is the reading and the scoring)
    small = {"rounds": 2, "clients_per_round": 2, "eval_every": 1, "batch_size": 4,
             "model": "mclr"}
    with pytest.raises(ConfigError, match="fesem-table1 reads LEAF's data folder.*--data-dir"):
        reproduce.run_table("fesem-table1", tmp_path / "x", overrides=small)
    with pytest.raises(ConfigError, match="unknown cell 'MNIST \\*'; allowed: FEMNIST NonFed"):
        reproduce.run_table("fesem-table1", tmp_path / "x", overrides=small,
                            data_dir=str(leaf), cells=["MNIST *"])
    out = tmp_path / "t1"
    found = reproduce.run_table("fesem-table1", out, seeds=1, overrides=small,
                                data_dir=str(leaf), cells=["FEMNIST FeSEM(2)", "FedCelebA FedAvg"])
    rows = found["rows"]
    assert [r["cell"] for r in rows] == ["FEMNIST FeSEM(2)", "FedCelebA FedAvg"]
    for r in rows:
        assert [e["header"] for e in r["metrics"]] == ["Micro-Acc", "Micro-F1", "Macro-Acc",
                                                        "Macro-F1"]
        for e in r["metrics"]:
            assert len(e["per_seed"]) == 1 and 0 <= e["mcfl_mean"] <= 100
            assert e["difference"] == pytest.approx(e["mcfl_mean"] - e["paper"])
    members = (out / "cells" / "femnist-fesem-2" / "members.csv").read_text()
    assert "final_f1_macro" in members
    assert rows[0]["metrics"][0]["paper"] == 84.8 and rows[1]["metrics"][3]["paper"] == 54.2
    text = (out / "table.md").read_text()
    assert "| cell | Micro-Acc | Micro-F1 | Macro-Acc | Macro-F1 |" in text
    assert "(84.8, " in text and "FedCelebA FedAvg" in text
    spec = json.loads((out / "reproduce.json").read_text())
    assert spec["base"]["test_fraction"] == 0.2
    # a part missing from --data-dir is named before anything runs
    with pytest.raises(Exception, match="celeba/data/train, which does not exist"):
        reproduce.run_table("fesem-table1", tmp_path / "y", overrides=small,
                            data_dir=str(tmp_path / "leaf2"), cells=["FedCelebA FedAvg"])
    assert main(["reproduce", "fesem-table1", "--out", str(tmp_path / "z")]) == 2
    assert "pass --data-dir DIR" in capsys.readouterr().err



def test_the_clustered_benchmark_table_is_its_generators_output():
    """experiments/tables/clustered-benchmark.toml is written by
    experiments/make_clustered_benchmark.py (its ~200 cells one product of three lists): the
    file and the generator agree, and in the quick form CFL's warm-up ends before its rounds
    do (its default 20 would take all 20), while the full form keeps CFL's defaults."""
    from experiments import make_clustered_benchmark as generator

    path = Path(generator.__file__).parent / "tables" / "clustered-benchmark.toml"
    assert path.read_text() == generator.table()
    table = reproduce.get("clustered-benchmark")
    for quick in (True, False):
        base = reproduce.base_config(table, quick)
        cells = reproduce.cell_configs(table, base, quick, patterns=["digits * CFL"])
        assert len(cells) == 4
        for _, config in cells:
            if quick:
                assert config.params.warmup == 10 < config.rounds == 20
            else:
                assert config.params.warmup == 20 < config.rounds


def test_the_clustered_benchmarks_full_form_asks_for_data_only_where_a_cell_reads_it(tmp_path):
    """Its digits and Fashion-MNIST cells run without --data-dir; a CIFAR-10 cell needs it,
    and a folder without CIFAR-10's binary files is named (with the cell) before anything
    runs; with the files (header-valid, tiny) the check passes."""
    table = reproduce.get("clustered-benchmark")
    base = reproduce.base_config(table, False)
    bundled = reproduce.cell_configs(table, base, patterns=["digits *", "fmnist *"])
    reproduce.check_data_dirs(table, False, None, bundled)
    cifar = reproduce.cell_configs(table, base, data_dir=str(tmp_path),
                                   patterns=["cifar10 P(X) FLUX"])
    with pytest.raises(ConfigError, match="pass --data-dir DIR"):
        reproduce.check_data_dirs(table, False, None, cifar)
    with pytest.raises(DataError, match="cell 'cifar10 P\\(X\\) FLUX': data directory .*cifar10"
                                        ".* does not exist"):
        reproduce.check_data_dirs(table, False, str(tmp_path), cifar)
    folder = tmp_path / "cifar10"
    folder.mkdir()
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        (folder / name).write_bytes(bytes(3073))
    reproduce.check_data_dirs(table, False, str(tmp_path), cifar)
