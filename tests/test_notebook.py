"""The notebooks run as written, in a Jupyter kernel (nbclient), so they cannot go stale: the
quickstart as it is, the reproduction notebook with its `parameters` cell made smaller (as
papermill would). A last cell added here reports what the checks read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def execute(name: str, workdir: Path, parameters: str | None = None, report: str = ""):
    """Run notebook `name` in a fresh kernel inside `workdir`; returns the executed notebook
    and the JSON printed by `report`, a cell appended at the end."""
    import nbformat
    from nbclient import NotebookClient

    os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    if parameters is not None:
        tagged = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, "one cell must be tagged 'parameters'"
        tagged[0].source = parameters
    if report:
        notebook.cells.append(
            nbformat.v4.new_code_cell(f"import json\nprint(json.dumps({report}))"))
    NotebookClient(notebook, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(workdir)}}).execute()
    found = None
    if report:
        found = json.loads("".join(o.get("text", "") for o in notebook.cells[-1].outputs))
    return notebook, found


@pytest.mark.slow  # (a kernel and a run: over a minute on 2 cores)
def test_quickstart_notebook_runs(tmp_path):
    _, found = execute("quickstart.ipynb", tmp_path, report=(
        "{'results': {f'{a},{s}': v for (a, s), v in results.items()}, "
        "'train_loss': float(metrics['train_loss']), 'mu': list(summary['mu']), "
        "'completed': [int(c) for c in summary['completed']], 'clustered': clustered}"))
    assert set(found["results"]) == {f"{a},{s}" for a in ("fedavg", "fedprox", "local")
                                     for s in (0, 1)}
    assert all(0 <= v <= 1 for v in found["results"].values())
    assert found["train_loss"] > 0
    assert found["mu"] == [0.0, 1.0] and found["completed"] == [3, 3]
    accuracy, ari = found["clustered"]["fesem"]
    assert ari is not None and accuracy > found["clustered"]["fedavg"][0]


SMALL_PARAMETERS = """\
seeds = 2
sweep_rounds = 2
table_cells = ["FedAvg", "FlexCFL"]
table_overrides = {"clients": 40, "rounds": 2, "local_epochs": 1, "clusters": 2,
                   "eval_every": 1}
out = Path("runs/notebook")
"""


@pytest.mark.slow  # (a kernel, a sweep and a table)
def test_reproduce_notebook_runs_a_sweep_and_a_table(tmp_path):
    notebook, found = execute("reproduce.ipynb", tmp_path, SMALL_PARAMETERS, report=(
        "{'mu': list(summary['mu']), 'completed': [int(c) for c in summary['completed']], "
        "'cells': [r['cell'] for r in found['rows']]}"))
    assert found["mu"] == [0.0, 0.1, 1.0] and found["completed"] == [2, 2, 2]
    assert found["cells"] == ["FedAvg", "FlexCFL"]
    table_output = notebook.cells[-3].outputs[0]["data"]["text/markdown"]
    assert "| FedAvg | 66.9 |" in table_output
    out = tmp_path / "runs" / "notebook"
    assert (out / "sweep" / "curves.png").is_file() and (out / "table3" / "table.png").is_file()
