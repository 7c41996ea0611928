"""`mcfl bench --suite accelerator --tiny`: every workload of the accelerator suite, end to end
at test size on the CPU (the suite's figures themselves come from a GPU: BENCHMARKS.md)."""

import json

import pytest

from mcfl.apps.bench_suite import TABLE_CELLS, accelerator_points
from mcfl.apps.cli import main


@pytest.mark.slow  # (every workload in this process: 2 minutes on 2 cores)
def test_the_tiny_suite_runs_every_workload_and_writes_its_folder(tmp_path, capsys):
    out = tmp_path / "suite"
    assert main(["bench", "--suite", "accelerator", "--tiny", "--out", str(out)]) == 0
    document = json.loads((out / "bench.json").read_text())
    labels = [p["label"] for p in document["points"]]
    assert labels == ([p.label for p in accelerator_points(tiny=True)]
                      + [f"table-{name}" for name in TABLE_CELLS])
    failed = [(p["label"], p.get("error")) for p in document["points"] if p["status"] != "ok"]
    assert not failed
    by_label = {p["label"]: p for p in document["points"]}
    for point in accelerator_points(tiny=True):
        record = by_label[point.label]
        assert record["seconds_per_round"] > 0
        assert (record.get("plan_round_seconds", 0) > 0) == point.plan  # plan's bound beside
    assert by_label["sweep-2-members"]["seconds_per_member_round"] > 0
    assert by_label["block-8"]["block_size"] == 8
    for name in TABLE_CELLS:
        assert by_label[f"table-{name}"]["rounds_completed"] == 2
    summary = (out / "summary.md").read_text()
    assert all(label in summary for label in labels)
    assert (out / "bench.png").stat().st_size > 0
    assert "table-flexcfl" in capsys.readouterr().out


def test_suite_flags_without_a_suite_are_refused(tmp_path, capsys):
    assert main(["bench", "--tiny", "--out", str(tmp_path)]) == 2
    assert "--suite accelerator" in capsys.readouterr().err
