"""`mcfl data export`: the rows mcfl trains on, written as LEAF JSON or npz, read back
identical (through mcfl's LEAF loader and the npz reader), written whole or not at all."""

from __future__ import annotations

import errno
import json

import numpy as np
import pytest

import mcfl
from mcfl import load_dataset
from mcfl.apps.cli import main
from mcfl.data import export
from mcfl.errors import DataError
from mcfl.files.atomic import WriteError

SETTINGS = {"dataset": "digits", "partition": "rotated:2", "clients": 6, "seed": 3}


@pytest.fixture(scope="module")
def planted():
    return load_dataset(mcfl.RunConfig(**SETTINGS))


def client_view(dataset, split):
    """Each client's (flat x, y) rows of `split`, in stored order."""
    a = dataset.arrays
    x = np.asarray(getattr(a, f"x_{split}"))
    y = np.asarray(getattr(a, f"y_{split}"))
    return [(x[r].reshape(len(r), -1), y[r]) for r in export.row_indices_of_clients(dataset, split)]


def assert_same_rows(got, want):
    assert got.client_ids == want.client_ids
    assert got.num_classes == want.num_classes
    for split in ("train", "test"):
        for (gx, gy), (wx, wy) in zip(client_view(got, split), client_view(want, split),
                                      strict=True):
            np.testing.assert_array_equal(gx, wx)  # bit for bit: nothing rounded
            np.testing.assert_array_equal(gy, wy)
    np.testing.assert_array_equal(got.true_cluster, want.true_cluster)


def test_leaf_export_reads_back_identical_through_the_leaf_loader(planted, tmp_path):
    assert planted.true_cluster is not None and len(set(planted.true_cluster)) == 2
    out = export.export_dataset(planted, tmp_path / "leaf", "leaf", SETTINGS)
    back = load_dataset(mcfl.RunConfig(dataset="leaf", data_dir=str(out)))
    assert_same_rows(back, planted)
    document = json.loads((out / "train" / "data.json").read_text())
    assert document["users"] == list(planted.client_ids)  # LEAF's own keys, nothing else
    assert set(document) == {"users", "num_samples", "user_data"}
    manifest = json.loads((out / export.MANIFEST).read_text())
    assert manifest["settings"] == SETTINGS and manifest["feature_shape"] == [8, 8]


def test_npz_export_reads_back_identical(planted, tmp_path):
    out = export.export_dataset(planted, tmp_path / "npz", "npz")
    back = export.read_npz(out)
    assert back.feature_shape == planted.feature_shape
    assert_same_rows(back, planted)


def test_command_writes_refuses_to_overwrite_and_reports_bad_paths(tmp_path, capsys):
    flags = ["--dataset", "digits", "--partition", "rotated:2", "--clients", "6"]
    out = tmp_path / "export"
    assert main(["data", "export", *flags, "--format", "npz", "--out", str(out)]) == 0
    written = (out / "data.npz").read_bytes()
    capsys.readouterr()
    assert main(["data", "export", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--overwrite" in err
    assert (out / "data.npz").read_bytes() == written  # the first export is kept
    assert main(["data", "export", *flags, "--out", str(out / "data.npz")]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(["data", "export", *flags, "--format", "leaf", "--out", str(out),
                 "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        export.MANIFEST, "test", "train", export.TRUE_CLUSTER]


def test_a_failed_export_leaves_the_previous_one_and_no_partial_folder(planted, tmp_path,
                                                                       monkeypatch):
    out = export.export_dataset(planted, tmp_path / "e", "npz")
    before = (out / "data.npz").read_bytes()

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export, "_leaf_json", full_disk)
    with pytest.raises(WriteError, match="No space left"):
        export.export_dataset(planted, out, "leaf", overwrite=True)
    assert (out / "data.npz").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]  # no staging folder left


@pytest.mark.parametrize("document, message", [
    ({"users": ["0", "1"], "true_cluster": [0, 1]}, "no true cluster for user '2'"),
    ({"users": ["0", "1", "2"], "true_cluster": [0, True, 1]}, "integers >= 0, got True"),
    ({"users": ["0"], "true_cluster": "0"}, "lists of one length"),
    ({"clusters": []}, "expected"),
])
def test_true_clusters_beside_leaf_files_are_read_strictly(tmp_path, document, message):
    (tmp_path / export.TRUE_CLUSTER).write_text(json.dumps(document))
    with pytest.raises(DataError, match=message):
        export.read_true_cluster(tmp_path, ("0", "1", "2"))
    assert export.read_true_cluster(tmp_path / "absent", ("0",)) is None
