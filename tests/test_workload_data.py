"""The workloads of recent clustered-FL papers on files the tests write in the real formats:
CIFAR-10 / CIFAR-100 binary batches (mcfl.data.cifar) and LEAF Shakespeare (mcfl.data.leaf)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import mcfl
from mcfl.data.leaf import load_leaf
from mcfl.data.leaf_strings import IMAGES, NUMBERS, TEXT, row_kind
from mcfl.data.loaders import load_arrays
from mcfl.errors import DataError

CIFAR10_FILES = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
CIFAR100_FILES = ["train.bin", "test.bin"]


def cifar_record(labels: list[int], k: int) -> bytes:
    """One record, written by the page's description: the label byte(s), then 1024 red, 1024
    green, 1024 blue bytes, each channel's 32x32 row by row. Image k is black but for pixel
    (row 1, column 2) = (10 + k, 20 + k, 30 + k) and pixel (row 31, column 0) pure red."""
    pixels = bytearray(3072)
    for channel, value in enumerate((10 + k, 20 + k, 30 + k)):
        pixels[channel * 1024 + 1 * 32 + 2] = value
    pixels[0 * 1024 + 31 * 32 + 0] = 255
    return bytes(labels) + bytes(pixels)


def expected_image(k: int) -> np.ndarray:
    image = np.zeros((32, 32, 3), np.uint8)
    image[1, 2] = (10 + k, 20 + k, 30 + k)
    image[31, 0] = (255, 0, 0)
    return image


def write_cifar10(folder, per_file: int = 2) -> list[int]:
    """The six files, `per_file` records each, the labels in file order (train, then test)."""
    folder.mkdir(parents=True, exist_ok=True)
    labels, k = [], 0
    for name in CIFAR10_FILES:
        records = []
        for _ in range(per_file):
            labels.append((7 * k + 3) % 10)
            records.append(cifar_record([labels[-1]], k))
            k += 1
        (folder / name).write_bytes(b"".join(records))
    return labels


def write_cifar100(folder) -> list[tuple[int, int]]:
    folder.mkdir(parents=True, exist_ok=True)
    pairs = [(19, 99), (0, 0), (5, 42), (12, 61), (3, 17)]  # (coarse, fine)
    (folder / "train.bin").write_bytes(b"".join(cifar_record(list(p), k)
                                                for k, p in enumerate(pairs[:3])))
    (folder / "test.bin").write_bytes(b"".join(cifar_record(list(p), k + 3)
                                               for k, p in enumerate(pairs[3:])))
    return pairs


def test_cifar10_records_are_hwc_images_with_their_labels(tmp_path):
    labels = write_cifar10(tmp_path / "cifar-10-batches-bin")
    arrays = load_arrays("cifar10", str(tmp_path / "cifar-10-batches-bin"))
    assert arrays.name == "cifar10" and arrays.num_classes == 10
    assert arrays.x.shape == (12, 32, 32, 3) and arrays.x.dtype == np.uint8
    for k in range(12):
        np.testing.assert_array_equal(arrays.x[k], expected_image(k), err_msg=f"image {k}")
    np.testing.assert_array_equal(arrays.y, labels)
    assert arrays.y.dtype == np.int64
    np.testing.assert_array_equal(arrays.official_train, [True] * 10 + [False] * 2)


def test_cifar100_uses_the_fine_label(tmp_path):
    pairs = write_cifar100(tmp_path / "cifar-100-binary")
    arrays = load_arrays("cifar100", str(tmp_path))  # the folder holding it
    assert arrays.name == "cifar100" and arrays.num_classes == 100
    np.testing.assert_array_equal(arrays.y, [fine for _, fine in pairs])
    for k in range(5):
        np.testing.assert_array_equal(arrays.x[k], expected_image(k))
    np.testing.assert_array_equal(arrays.official_train, [True] * 3 + [False] * 2)


def test_data_dir_is_the_extracted_folder_or_its_parent(tmp_path):
    write_cifar10(tmp_path / "cifar-10-batches-bin")
    direct = load_arrays("cifar10", str(tmp_path / "cifar-10-batches-bin"))
    parent = load_arrays("cifar10", str(tmp_path))
    np.testing.assert_array_equal(direct.x, parent.x)
    np.testing.assert_array_equal(direct.y, parent.y)
    assert mcfl.RunConfig(dataset="tfds:cifar100").dataset == "tfds:cifar100"  # a known name


def _refusal(dataset: str, data_dir, message: str) -> None:
    with pytest.raises(DataError) as err:
        load_arrays(dataset, None if data_dir is None else str(data_dir))
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_cifar_refusals_are_one_line_naming_the_file_and_value(tmp_path):
    _refusal("cifar10", None, "cifar10 needs --data-dir DIR holding cifar-10-batches-bin/; "
             "download the binary version (cifar-10-binary.tar.gz)")
    _refusal("cifar100", tmp_path / "nowhere", f"data directory '{tmp_path / 'nowhere'}' for "
             "cifar100 does not exist")
    pickled = tmp_path / "py" / "cifar-10-batches-py"
    pickled.mkdir(parents=True)
    (pickled / "data_batch_1").write_bytes(b"\x80\x02")
    for where in (pickled, pickled.parent):
        _refusal("cifar10", where, f"{where} holds the Python (pickle) version of cifar10, which "
                 "mcfl does not read")
    _refusal("cifar10", pickled, "or use --dataset tfds:cifar10")
    folder = tmp_path / "bin" / "cifar-10-batches-bin"
    write_cifar10(folder)
    (folder / "data_batch_3.bin").unlink()
    (folder / "test_batch.bin").unlink()
    _refusal("cifar10", folder.parent, f"{folder} has no data_batch_3.bin, test_batch.bin: "
             "--data-dir must name cifar-10-batches-bin/")
    _refusal("cifar100", folder.parent, f"{folder.parent} has no train.bin, test.bin")


@pytest.mark.parametrize("damage, message", [
    (lambda raw: raw + b"\x00", "test_batch.bin has 6147 bytes, not a positive multiple of "
     "cifar10's 3073-byte record (1 label byte + 3072 pixels)"),
    (lambda raw: b"", "test_batch.bin has 0 bytes"),
    (lambda raw: raw[:3073] + b"\x0a" + raw[3074:], "test_batch.bin: record 1 has label 10 in "
     "byte 0, but cifar10's labels there are 0 to 9"),
])
def test_damaged_cifar10_files_are_named(tmp_path, damage, message):
    write_cifar10(tmp_path)
    path = tmp_path / "test_batch.bin"
    path.write_bytes(damage(path.read_bytes()))
    _refusal("cifar10", tmp_path, f"{path}{message[len('test_batch.bin'):]}")


def test_cifar100_labels_beyond_their_classes_are_named(tmp_path):
    write_cifar100(tmp_path)
    path = tmp_path / "test.bin"
    raw = bytearray(path.read_bytes())
    raw[3074 + 1] = 100  # record 1's fine label
    path.write_bytes(bytes(raw))
    _refusal("cifar100", tmp_path, f"{path}: record 1 has label 100 in byte 1, but cifar100's "
             "labels there are 0 to 99")
    raw[3074 + 1], raw[0] = 5, 20  # record 0's coarse label
    path.write_bytes(bytes(raw))
    _refusal("cifar100", tmp_path, "record 0 has label 20 in byte 0, but cifar100's labels "
             "there are 0 to 19")
    (tmp_path / "train.bin").write_bytes(b"\x00" * 3073 * 2)  # CIFAR-10's record size
    _refusal("cifar100", tmp_path, "not a positive multiple of cifar100's 3074-byte record (2 "
             "label bytes + 3072 pixels)")


def test_cifar10_runs_a_round_with_planted_rotations(tmp_path, capsys):
    from mcfl.apps.cli import main

    write_cifar10(tmp_path / "cifar-10-batches-bin", per_file=10)  # 60 images
    config = mcfl.RunConfig(dataset="cifar10", data_dir=str(tmp_path), clients=4, rounds=1,
                            model="mclr", partition="rotated:2")
    result = mcfl.run(config)
    assert result.summary["rounds_completed"] == 1
    assert np.isfinite(result.summary["final_accuracy_micro"])
    code = main(["data", "describe", "--dataset", "cifar10", "--no-cache"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cifar10 needs --data-dir" in err, err


# --- LEAF Shakespeare ---------------------------------------------------------------------

VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
TEXT_SOURCE = VOCABULARY * 3


def _lines(start: int, count: int) -> tuple[list[str], list[str]]:
    """`count` 80-character windows of the text from `start`, each with its next character."""
    x = [TEXT_SOURCE[start + k: start + k + 80] for k in range(count)]
    return x, [TEXT_SOURCE[start + k + 80] for k in range(count)]


SHAKESPEARE_TRAIN = {"THE_TEMPEST_ARIEL": _lines(0, 3), "HAMLET_HORATIO": _lines(5, 2),
                     "KING_LEAR_EDGAR": _lines(40, 2)}
SHAKESPEARE_TEST = {"THE_TEMPEST_ARIEL": _lines(70, 1), "HAMLET_HORATIO": _lines(71, 1),
                    "KING_LEAR_EDGAR": _lines(72, 1)}


def write_shakespeare(root, train=None, test=None):
    for split, users, default in (("train", train, SHAKESPEARE_TRAIN),
                                  ("test", test, SHAKESPEARE_TEST)):
        users = default if users is None else users
        (root / split).mkdir(parents=True)
        document = {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
                    "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}
        (root / split / "all_data_niid_0_keep_0.json").write_text(json.dumps(document))
    return root


def _indices(start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The expected rows of `_lines(start, count)`: the text's positions modulo 80."""
    x = np.array([[(start + k + j) % 80 for j in range(80)] for k in range(count)], np.float32)
    return x, np.array([(start + k + 80) % 80 for k in range(count)], np.int64)


def test_shakespeare_characters_become_vocabulary_indices(tmp_path):
    ds = load_leaf(write_shakespeare(tmp_path))
    assert ds.client_ids == ("THE_TEMPEST_ARIEL", "HAMLET_HORATIO", "KING_LEAR_EDGAR")
    assert ds.feature_shape == (80,) and ds.num_classes == 80
    assert ds.arrays.x_train.dtype == np.float32
    a = ds.arrays
    np.testing.assert_array_equal(a.x_train[0], np.arange(80))  # the vocabulary itself
    assert [VOCABULARY[i] for i in (0, 1, 25, 53, 79)] == ["\n", " ", "A", "a", "}"]
    starts = [(0, 3), (5, 2), (40, 2)]
    expected = [_indices(s, n) for s, n in starts]
    np.testing.assert_array_equal(a.x_train, np.concatenate([x for x, _ in expected]))
    np.testing.assert_array_equal(a.y_train, np.concatenate([y for _, y in expected]))
    np.testing.assert_array_equal(a.y_train[:3], [0, 1, 2])  # "\n", " ", "!" follow row 0..2
    np.testing.assert_array_equal(a.x_test, np.concatenate(
        [_indices(70 + k, 1)[0] for k in range(3)]))
    np.testing.assert_array_equal(a.y_test, [70, 71, 72])
    np.testing.assert_array_equal(ds.train_counts(), [3, 2, 2])


def test_string_rows_name_images_only_with_an_image_suffix():
    assert row_kind("000001.jpg") == row_kind("img.PNG") == row_kind("a.jpeg") == IMAGES
    assert row_kind("to be, or not to be.") == row_kind("jpg") == TEXT
    assert row_kind([0.5, 1.0]) == NUMBERS


def _user(x, y) -> dict:
    return {"THE_TEMPEST_ARIEL": (x, y)}


ROW = VOCABULARY  # a valid 80-character row
SHAKESPEARE_REFUSALS = [
    (_user([ROW, ROW[:40] + "@" + ROW[41:]], ["a", "b"]),
     "x of user 'THE_TEMPEST_ARIEL' in {train} holds \"@\" (row 1, character 40), which is not "
     "in LEAF Shakespeare's 80-character vocabulary"),
    (_user([ROW[:79] + "\u00e9"], ["a"]), "holds \"\\u00e9\" (row 0, character 79)"),
    (_user([ROW, ROW[:79]], ["a", "b"]),
     "x row 1 of user 'THE_TEMPEST_ARIEL' in {train} has 79 characters (\"\\n !\\\"&'(),"),
    (_user([ROW, ROW + "a"], ["a", "b"]), "row 1 of user 'THE_TEMPEST_ARIEL' in {train} has 81 "
     "characters"),
    (_user([ROW], ["ab"]), "labels of user 'THE_TEMPEST_ARIEL' in {train} must be single "
     "characters, as its x rows are text (strings not ending in .jpg, .jpeg or .png), got "
     "\"ab\" (label 0)"),
    (_user([ROW], [3]), "must be single characters, as its x rows are text"),
    (_user([ROW], ["@"]), "label 0 of user 'THE_TEMPEST_ARIEL' in {train} is \"@\", which is not "
     "in LEAF Shakespeare's 80-character vocabulary"),
    (_user([ROW, [0.0] * 80], ["a", "b"]), "x of user 'THE_TEMPEST_ARIEL' in {train} mixes text "
     "rows with other values: row 1 is [0.0, 0.0, 0.0,"),
    (_user([[0.0] * 80, ROW], [1, 2]), "x of user 'THE_TEMPEST_ARIEL' in {train} must be a list "
     "of rows, each a list of numbers; row 1 is \"\\n !"),
    ({**_user([ROW], ["a"]), "HAMLET_HORATIO": ([[0.0] * 80], [1])},
     "x of user 'HAMLET_HORATIO' in {train} holds rows of numbers, but that of user "
     "'THE_TEMPEST_ARIEL' in {train} holds text; every row of a dataset must be of one kind"),
    (_user([""], ["a"]), "x row 0 of user 'THE_TEMPEST_ARIEL' in {train} is an empty string"),
]


@pytest.mark.parametrize("train, message", SHAKESPEARE_REFUSALS)
def test_shakespeare_refusals_name_file_user_and_value(tmp_path, train, message):
    root = write_shakespeare(tmp_path, train=train, test={})
    path = root / "train" / "all_data_niid_0_keep_0.json"
    with pytest.raises(DataError) as err:
        load_leaf(root)
    assert message.format(train=path) in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_text_rows_of_another_length_than_earlier_users_are_named(tmp_path):
    test = {"HAMLET_HORATIO": ([ROW[:60]], ["a"])}
    root = write_shakespeare(tmp_path, test=test)
    path = root / "test" / "all_data_niid_0_keep_0.json"
    with pytest.raises(DataError, match=re.escape(f"x rows of user 'HAMLET_HORATIO' in {path} "
                                                  "have shape (60,), but those of")):
        load_leaf(root)


def test_shakespeare_runs_a_round_with_an_mlp(tmp_path):
    root = write_shakespeare(tmp_path)
    result = mcfl.run(mcfl.RunConfig(dataset="leaf", data_dir=str(root), rounds=1, model="mlp"))
    assert result.summary["rounds_completed"] == 1
    assert np.isfinite(result.summary["final_accuracy_micro"])
