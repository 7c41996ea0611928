"""LEAF JSON loader: natural clients kept whole and in order, images decoded, clear errors."""

import json
import re

import numpy as np
import pytest
from PIL import Image

from mcfl.data.leaf import load_leaf
from mcfl.errors import DataError

DIM = 4


def _rows(start: int, count: int) -> tuple[list, list]:
    """`count` distinct rows (exact in float32) with labels; row k starts at value start + k."""
    x = [[start + k + j / 4 for j in range(DIM)] for k in range(count)]
    y = [(start + k) % 7 for k in range(count)]
    return x, y


# Users spread over sorted files, in a non-alphabetical order, w9 in both train files.
TRAIN = {
    "part_0.json": {"w9": _rows(0, 3), "w1": _rows(10, 5)},
    "part_1.json": {"w5": _rows(20, 1), "w9": _rows(30, 2)},
}
TEST = {
    "part_0.json": {"w1": _rows(40, 1), "w9": _rows(50, 2)},
    "part_1.json": {"w5": _rows(60, 2)},
}
ORDER = ("w9", "w1", "w5")


def _document(users: dict) -> dict:
    return {
        "users": list(users),
        "num_samples": [len(y) for _, y in users.values()],
        "user_data": {user: {"x": x, "y": y} for user, (x, y) in users.items()},
    }


def _write_split(folder, files: dict) -> None:
    folder.mkdir(parents=True)
    for name in reversed(list(files)):  # written out of order: the loader must sort
        (folder / name).write_text(json.dumps(_document(files[name])))


def _write_leaf(root, train=TRAIN, test=TEST):
    _write_split(root / "train", train)
    _write_split(root / "test", test)
    return root


def _expected(split: dict, user: str) -> tuple[np.ndarray, np.ndarray]:
    """A user's rows in file order, concatenated."""
    blocks = [users[user] for _, users in sorted(split.items()) if user in users]
    x = np.concatenate([np.asarray(x, np.float32).reshape(-1, DIM) for x, _ in blocks])
    return x, np.concatenate([np.asarray(y, np.int64) for _, y in blocks])


def _client_rows(ds, split: str, client: int) -> tuple[np.ndarray, np.ndarray]:
    arrays = ds.arrays
    offsets = np.asarray(getattr(arrays, f"{split}_offsets"))
    counts = np.asarray(getattr(arrays, f"{split}_counts"))
    rows = slice(offsets[client], offsets[client] + counts[client])
    x = np.asarray(getattr(arrays, f"x_{split}"))[rows]
    return x, np.asarray(getattr(arrays, f"y_{split}"))[rows]


def test_each_user_is_a_client_with_exactly_its_rows(tmp_path):
    ds = load_leaf(_write_leaf(tmp_path), name="femnist-like")
    assert ds.name == "femnist-like"
    assert ds.client_ids == ORDER  # first appearance in sorted files, not alphabetical
    np.testing.assert_array_equal(ds.train_counts(), [5, 5, 1])
    np.testing.assert_array_equal(ds.test_counts(), [2, 1, 2])
    assert ds.arrays.x_train.dtype == np.float32 and ds.arrays.x_train.shape == (11, DIM)
    assert ds.arrays.x_test.shape == (5, DIM) and ds.feature_shape == (DIM,)
    for client, user in enumerate(ORDER):
        for split, files in (("train", TRAIN), ("test", TEST)):
            x, y = _client_rows(ds, split, client)
            want_x, want_y = _expected(files, user)
            np.testing.assert_array_equal(x, want_x)
            np.testing.assert_array_equal(y, want_y)
    all_labels = np.concatenate([ds.arrays.y_train, ds.arrays.y_test])
    assert ds.num_classes == all_labels.max() + 1 == 7


def test_num_clients_keeps_the_first_users_and_only_their_rows(tmp_path):
    ds = load_leaf(_write_leaf(tmp_path), num_clients=2, num_classes=10)
    assert ds.client_ids == ("w9", "w1") and ds.num_classes == 10
    np.testing.assert_array_equal(ds.train_counts(), [5, 5])
    np.testing.assert_array_equal(ds.test_counts(), [2, 1])
    x, _ = _client_rows(ds, "test", 0)
    np.testing.assert_array_equal(x, _expected(TEST, "w9")[0])
    assert ds.arrays.x_test.shape == (3, DIM)


def test_test_fraction_pools_each_users_rows_and_splits_them_again(tmp_path):
    """FeSEM's 80 / 20 per device: each user keeps exactly its rows of both files, floor(0.8 m)
    of them for training; another seed draws another split."""
    root = _write_leaf(tmp_path)
    ds = load_leaf(root, test_fraction=0.2, seed=0)
    # w9: 5 train + 2 test rows -> 5 / 2; w1: 5 + 1 -> 4 / 2; w5: 1 + 2 -> 2 / 1
    np.testing.assert_array_equal(ds.train_counts(), [5, 4, 2])
    np.testing.assert_array_equal(ds.test_counts(), [2, 2, 1])
    for client, user in enumerate(ORDER):
        pooled = np.concatenate([_expected(TRAIN, user)[0], _expected(TEST, user)[0]])
        got = np.concatenate([_client_rows(ds, "train", client)[0],
                              _client_rows(ds, "test", client)[0]])
        assert sorted(map(tuple, got)) == sorted(map(tuple, pooled))
    splits = {tuple(_client_rows(load_leaf(root, test_fraction=0.2, seed=s), "test", 0)[0][:, 0])
              for s in range(6)}
    assert len(splits) > 1


def test_more_clients_than_users_is_an_error(tmp_path):
    with pytest.raises(DataError, match="asked for 4 clients.*only 3 users"):
        load_leaf(_write_leaf(tmp_path), num_clients=4)


def test_users_without_test_rows_are_kept(tmp_path):
    test = {"only.json": {"w1": _rows(40, 2)}}
    ds = load_leaf(_write_leaf(tmp_path, test=test))
    np.testing.assert_array_equal(ds.test_counts(), [0, 2, 0])


def _write_image(path, mode: str, size: tuple[int, int], color) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)


@pytest.mark.parametrize("images_beside_data", [False, True])
def test_celeba_images_are_loaded_resized_rgb_in_unit_range(tmp_path, images_beside_data):
    data_dir = tmp_path / "data"
    image_root = tmp_path if images_beside_data else data_dir  # raw/ in data_dir or its parent
    folder = image_root / "raw" / "img_align_celeba"
    _write_image(folder / "000001.png", "RGB", (178, 218), (255, 0, 0))
    _write_image(folder / "000002.png", "L", (20, 30), 51)  # grey: converted to RGB
    _write_image(folder / "000003.jpg", "RGB", (50, 40), (0, 0, 255))
    # labels as LEAF's CelebA preprocessing writes them: (attribute + 1) / 2, floats 1.0 / 0.0
    train = {"a.json": {"celeb_7": (["000001.png", "000002.png"], [1.0, 0.0])}}
    test = {"a.json": {"celeb_7": (["000003.jpg"], [1])}}
    ds = load_leaf(_write_leaf(data_dir, train, test), name="celeba-like")
    x_train, x_test = np.asarray(ds.arrays.x_train), np.asarray(ds.arrays.x_test)
    assert x_train.shape == (2, 84, 84, 3) and x_test.shape == (1, 84, 84, 3)
    assert x_train.dtype == np.float32 and 0.0 <= x_train.min() and x_train.max() <= 1.0
    np.testing.assert_array_equal(x_train[0], np.broadcast_to([1.0, 0.0, 0.0], (84, 84, 3)))
    np.testing.assert_allclose(x_train[1], 0.2, atol=1e-6)
    np.testing.assert_allclose(x_test[0], np.broadcast_to([0, 0, 1], (84, 84, 3)), atol=0.02)
    np.testing.assert_array_equal(ds.arrays.y_train, [1, 0])  # integral floats read as ints
    assert ds.num_classes == 2 and ds.client_ids == ("celeb_7",)


def test_image_size_sets_the_image_shape(tmp_path):
    _write_image(tmp_path / "raw" / "img_align_celeba" / "1.png", "RGB", (9, 9), (0, 255, 0))
    train = {"a.json": {"u": (["1.png"], [0])}}
    ds = load_leaf(_write_leaf(tmp_path, train, {"a.json": {}}), image_size=16)
    assert ds.feature_shape == (16, 16, 3)


def test_missing_image_file_names_the_path(tmp_path):
    _write_image(tmp_path / "raw" / "img_align_celeba" / "1.png", "RGB", (9, 9), (0, 255, 0))
    train = {"a.json": {"u": (["1.png", "2.png"], [0, 1])}}
    _write_leaf(tmp_path, train, {"a.json": {}})
    missing = tmp_path / "raw" / "img_align_celeba" / "2.png"
    with pytest.raises(DataError, match=re.escape(f"image file {missing} does not exist")):
        load_leaf(tmp_path)


def test_missing_data_dir_is_an_error(tmp_path):
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'nowhere'} does not exist")):
        load_leaf(tmp_path / "nowhere")


def test_missing_split_folder_is_named(tmp_path):
    _write_split(tmp_path / "train", TRAIN)
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'test'} does not exist")):
        load_leaf(tmp_path)


def test_split_folder_without_json_is_named(tmp_path):
    _write_split(tmp_path / "train", TRAIN)
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "notes.txt").write_text("not data")
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'test'} holds no .json file")):
        load_leaf(tmp_path)


def test_invalid_json_names_the_file_and_position(tmp_path):
    _write_leaf(tmp_path)
    broken = tmp_path / "train" / "part_1.json"
    broken.write_text('{"users": ["w5"],\n "num_samples": [1,]}')
    message = rf"{re.escape(str(broken))} is not valid JSON: .* line 2, column"
    with pytest.raises(DataError, match=message):
        load_leaf(tmp_path)


@pytest.mark.parametrize("key", ["users", "num_samples", "user_data"])
def test_missing_key_names_the_key_and_file(tmp_path, key):
    _write_leaf(tmp_path)
    path = tmp_path / "test" / "part_1.json"
    document = _document(TEST["part_1.json"])
    del document[key]
    path.write_text(json.dumps(document))
    with pytest.raises(DataError, match=re.escape(f"{path} has no key '{key}'")):
        load_leaf(tmp_path)


def test_missing_x_of_a_user_is_named(tmp_path):
    _write_leaf(tmp_path)
    path = tmp_path / "train" / "part_0.json"
    document = _document(TRAIN["part_0.json"])
    del document["user_data"]["w1"]["y"]
    path.write_text(json.dumps(document))
    with pytest.raises(DataError, match=re.escape(f"user_data['w1'] in {path} has no key 'y'")):
        load_leaf(tmp_path)


@pytest.mark.parametrize("field", ["num_samples", "x", "y"])
def test_num_samples_must_match_the_rows(tmp_path, field):
    _write_leaf(tmp_path)
    path = tmp_path / "train" / "part_1.json"
    document = _document(TRAIN["part_1.json"])
    if field == "num_samples":
        document["num_samples"][1] = 3  # w9 has 2 rows here
    else:
        document["user_data"]["w9"][field].pop()
    path.write_text(json.dumps(document))
    with pytest.raises(DataError, match=re.escape(f"for user 'w9' in {path}, but it has")):
        load_leaf(tmp_path)


def test_ragged_x_rows_are_named(tmp_path):
    train = {"a.json": {"w1": ([[0.0, 1.0], [0.0, 1.0, 2.0]], [0, 1])}}
    _write_leaf(tmp_path, train, {"a.json": {}})
    path = tmp_path / "train" / "a.json"
    with pytest.raises(DataError, match=re.escape(f"user 'w1' in {path} have different lengths")):
        load_leaf(tmp_path)


def test_rows_of_another_length_than_earlier_users_are_named(tmp_path):
    test = {"a.json": {"w1": ([[0.0, 1.0]], [0])}}  # train rows have DIM values
    _write_leaf(tmp_path, test=test)
    path = tmp_path / "test" / "a.json"
    with pytest.raises(DataError, match=re.escape(f"x rows of user 'w1' in {path} have shape")):
        load_leaf(tmp_path)


def test_test_user_missing_from_train_is_named(tmp_path):
    test = {"a.json": {"w1": _rows(40, 1), "stranger": _rows(70, 1)}}
    _write_leaf(tmp_path, test=test)
    with pytest.raises(DataError, match="user 'stranger' in .* has test data but does not"):
        load_leaf(tmp_path)


def test_non_integer_labels_are_named(tmp_path):
    train = {"a.json": {"w1": ([[0.0], [1.0]], [0, 0.5])}}
    _write_leaf(tmp_path, train, {"a.json": {}})
    with pytest.raises(DataError, match="labels of user 'w1' in .* must be integers from 0 to "
                       r"65535 \(class indices\), got 0.5 \(label 1\)"):
        load_leaf(tmp_path)


def test_nan_or_infinite_features_name_the_file_and_user(tmp_path):
    train = {"a.json": {"w1": ([[0.0, 1.0], [float("nan"), 2.0]], [0, 1])}}  # JSON's NaN
    _write_leaf(tmp_path, train, {"a.json": {"w1": ([[0.0, 1.0]], [0])}})
    with pytest.raises(DataError, match=r"x of user 'w1' in .*a.json holds NaN or infinity "
                                        r"\(row 1: nan\)"):
        load_leaf(tmp_path)


def test_test_files_listing_no_users_stop_a_run_before_it_starts(tmp_path):
    import mcfl

    _write_leaf(tmp_path, test={"a.json": {}})
    assert load_leaf(tmp_path).test_counts().sum() == 0  # loading alone is fine
    with pytest.raises(DataError, match=r"'leaf' has no test rows for its 3 client\(s\); runs "
                                        r"are scored on test rows: its test/\*.json files list "
                                        r"none of them, or give --test-fraction"):
        mcfl.run(mcfl.RunConfig(dataset="leaf", data_dir=str(tmp_path), rounds=1))


def test_labels_beyond_the_classes_name_the_user_and_file(tmp_path):
    _write_leaf(tmp_path)
    with pytest.raises(DataError, match=r"label 6 of user 'w1' in .*part_0.json is out of range: "
                                        r"this dataset has 5 classes \(0 to 4\)"):
        load_leaf(tmp_path, num_classes=5)


def test_all_users_are_clients_unless_asked_and_home_is_expanded(tmp_path, monkeypatch, capsys):
    import json as json_

    import mcfl
    from mcfl.apps.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))
    _write_leaf(tmp_path / "leafdata")
    config = mcfl.RunConfig(dataset="leaf", data_dir="~/leafdata")
    assert config.data_dir == str(tmp_path / "leafdata") and config.clients is None
    assert mcfl.load_dataset(config).num_clients == 3
    assert mcfl.RunConfig(dataset="leaf", data_dir="x", clients=2).clients == 2
    assert mcfl.RunConfig(dataset="digits").clients == 100  # split datasets: 100 by default
    out = tmp_path / "run"
    assert main(["run", "--dataset", "leaf", "--data-dir", "~/leafdata", "--rounds", "1",
                 "--no-cache", "--out", str(out)]) == 0
    assert "leaf: all 3 users are clients" in capsys.readouterr().out
    summary = json_.loads((out / "summary.json").read_text())
    assert summary["config"]["clients"] == 3 and summary["dataset"]["clients"] == 3


def test_an_empty_user_list_and_unlisted_user_data_are_named(tmp_path):
    _write_leaf(tmp_path / "empty", train={"a.json": {}}, test={"a.json": {}})
    with pytest.raises(DataError, match=r"the train files in .*train list no users"):
        load_leaf(tmp_path / "empty")
    root = _write_leaf(tmp_path / "extra")
    path = root / "train" / "part_0.json"
    document = json.loads(path.read_text())
    document["user_data"]["ghost"] = {"x": [[0.0] * DIM], "y": [0]}
    path.write_text(json.dumps(document))
    with pytest.raises(DataError, match=r"'user_data' in .*part_0.json holds user\(s\) not "
                                        r"listed in 'users': 'ghost'"):
        load_leaf(root)


def test_labels_too_large_for_an_integer_are_named(tmp_path):
    train = {"a.json": {"w1": ([[0.0] * DIM], [2 ** 70])}}
    _write_leaf(tmp_path, train=train, test={"a.json": {}})
    with pytest.raises(DataError, match=r"labels of user 'w1' .* must be integers from 0 to "
                                        r"65535 \(class indices\), got 1180591620717411303424"):
        load_leaf(tmp_path)
