"""The quickstart notebook's code cells run as written (so the documented API stays true)."""

import json
from pathlib import Path

import matplotlib

NOTEBOOK = Path(__file__).parent.parent / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_runs():
    matplotlib.use("Agg")
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    namespace: dict = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), str(NOTEBOOK), "exec"), namespace)
    assert set(namespace["results"]) == {(a, s) for a in ("fedavg", "fedprox", "local")
                                         for s in (0, 1)}
    assert all(0 <= v <= 1 for v in namespace["results"].values())
    assert namespace["metrics"]["train_loss"] > 0
    summary = namespace["summary"]
    assert list(summary["mu"]) == [0.0, 1.0] and list(summary["completed"]) == [3, 3]
    accuracy, ari = namespace["clustered"]["fesem"]
    assert ari is not None and accuracy > namespace["clustered"]["fedavg"][0]
