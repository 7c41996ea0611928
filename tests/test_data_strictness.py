"""Bad input read strictly, each refused in one line naming the value, the file or flag, and
what is allowed: every field of LEAF / FedProx JSON files, datasets left without rows, and the
list values of flags and config files (hand-made cases; tests/test_fuzz.py draws random ones)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from mcfl.apps.cli import main
from mcfl.data.federated import from_owner, from_splits, split_train_test
from mcfl.data.leaf import load_leaf
from mcfl.errors import ConfigError, DataError
from mcfl.settings import parse_int_list
from mcfl.sweeps.spec import check_grid, parse_grid, parse_seeds


def _valid() -> dict:
    def doc(users):
        return {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
                "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}

    return {"train": doc({"a": ([[0.0, 0.5], [1.0, 1.5]], [0, 1]), "b": ([[2.0, 2.5]], [2])}),
            "test": doc({"a": ([[3.0, 3.5]], [1]), "b": ([[4.0, 4.5]], [0])})}


def _write(root, documents: dict, raw: dict | None = None):
    for split, document in documents.items():
        (root / split).mkdir(parents=True, exist_ok=True)
        data = (raw or {}).get(split)
        (root / split / "p.json").write_bytes(data if data is not None
                                              else json.dumps(document).encode())
    return root


def _train(documents: dict) -> dict:
    return documents["train"]


def _a(documents: dict) -> dict:
    return documents["train"]["user_data"]["a"]


# (change to the valid files, the message it must give; {train} is the train file)
FIELD_CASES = [
    (lambda d: _train(d).update(users="ab"),
     "in {train}, 'users' and 'num_samples' must be lists, 'user_data' an object; got str, "
     "list, object"),
    (lambda d: _train(d)["users"].__setitem__(1, "a"), "user 'a' is listed twice in {train}"),
    (lambda d: _train(d)["users"].__setitem__(1, 7),
     "user names in {train} must be non-empty strings of text, got 7"),
    (lambda d: _train(d)["users"].__setitem__(1, ""),
     "user names in {train} must be non-empty strings of text, got \"\""),
    (lambda d: _train(d)["users"].__setitem__(1, "\ud800"),
     "user names in {train} must be non-empty strings of text, got \"\\ud800\""),
    (lambda d: _train(d)["num_samples"].__setitem__(0, 2.5),
     "num_samples of user 'a' in {train} must be a count (an integer >= 0), got 2.5"),
    (lambda d: _train(d)["num_samples"].__setitem__(0, 2.0),
     "num_samples of user 'a' in {train} must be a count (an integer >= 0), got 2.0"),
    (lambda d: _train(d)["num_samples"].__setitem__(1, True),
     "num_samples of user 'b' in {train} must be a count (an integer >= 0), got true"),
    (lambda d: _train(d)["num_samples"].__setitem__(0, 3),
     "num_samples says 3 for user 'a' in {train}, but it has 2 x rows and 2 labels"),
    (lambda d: _train(d)["num_samples"].append(1), "{train} lists 2 users but 3 num_samples"),
    (lambda d: _train(d)["user_data"].pop("b"),
     "user 'b' listed in {train} has no entry in 'user_data'"),
    (lambda d: _train(d)["user_data"].update(c={"x": [[0.0, 0.0]], "y": [0]}),
     "'user_data' in {train} holds user(s) not listed in 'users': 'c'"),
    (lambda d: _a(d).pop("y"), "user_data['a'] in {train} has no key 'y'"),
    (lambda d: _a(d)["x"][1].__setitem__(0, "1.0"),
     "x of user 'a' in {train} must hold numbers only, but row 1 holds \"1.0\""),
    (lambda d: _a(d)["x"][1].__setitem__(0, None),
     "x of user 'a' in {train} must hold numbers only, but row 1 holds null"),
    (lambda d: _a(d)["x"][1].__setitem__(1, True),  # beside numbers, numpy would read 1.0
     "x of user 'a' in {train} must hold numbers only, but row 1 holds true"),
    (lambda d: _a(d)["x"][0].__setitem__(1, [1.0]),
     "x of user 'a' in {train} must hold numbers only, but row 0 holds [1.0]"),
    (lambda d: _a(d)["x"].__setitem__(1, 1.0),
     "x of user 'a' in {train} must be a list of rows, each a list of numbers; row 1 is 1.0"),
    (lambda d: _a(d)["x"][1].append(2.0),
     "x rows of user 'a' in {train} have different lengths (2 to 3)"),
    (lambda d: _a(d).update(x=[[], []]),
     "x rows of user 'a' in {train} are empty; every row needs at least one feature"),
    (lambda d: _a(d)["x"][1].__setitem__(0, float("nan")),
     "x of user 'a' in {train} holds NaN or infinity (row 1: nan)"),
    (lambda d: _a(d)["x"][1].__setitem__(0, 1e39),
     "x of user 'a' in {train} holds a number beyond float32's range (row 1: 1e+39)"),
    (lambda d: _a(d)["x"][0].__setitem__(0, 10 ** 400),
     "x of user 'a' in {train} holds a number beyond float32's range (row 0: inf)"),
    (lambda d: _train(d)["user_data"]["b"].update(x=[[1.0, 2.0, 3.0]]),
     "x rows of user 'b' in {train} have shape (3,), but those of user 'a' in {train} have "
     "shape (2,)"),
    (lambda d: _a(d)["y"].__setitem__(1, 1.5),
     "labels of user 'a' in {train} must be integers from 0 to 65535 (class indices), got 1.5 "
     "(label 1)"),
    (lambda d: _a(d)["y"].__setitem__(0, False),
     "got false (label 0; a boolean: write the class as 0 or 1)"),
    (lambda d: _a(d)["y"].__setitem__(0, "1"), "(class indices), got \"1\" (label 0)"),
    (lambda d: _a(d)["y"].__setitem__(0, -1), "(class indices), got -1 (label 0)"),
    (lambda d: _a(d)["y"].__setitem__(0, 65536), "(class indices), got 65536 (label 0)"),
    (lambda d: _a(d)["y"].__setitem__(0, None), "(class indices), got null (label 0)"),
    (lambda d: d["test"]["users"].__setitem__(1, "c")
     or d["test"]["user_data"].__setitem__("c", d["test"]["user_data"].pop("b")),
     "user 'c' in {test} has test data but does not appear in {root}/train; every test user "
     "needs train rows too"),
    (lambda d: _train(d)["num_samples"].__setitem__(1, 0)
     or _train(d)["user_data"].__setitem__("b", {"x": [], "y": []}),
     "user(s) 'b' in {root}/train have no training rows (num_samples 0); every client needs "
     "at least one"),
    (lambda d: _train(d).update(users=[], num_samples=[], user_data={}),
     "the train files in {root}/train list no users (every 'users' list is empty)"),
    (lambda d: _train(d).pop("num_samples"),
     "{train} has no key 'num_samples' (expected keys: users, num_samples, user_data)"),
]


@pytest.mark.parametrize("change, message", FIELD_CASES)
def test_each_field_of_leaf_files_is_checked(tmp_path, change, message):
    documents = _valid()
    change(documents)
    root = _write(tmp_path, documents)
    where = {"root": tmp_path, "train": root / "train" / "p.json",
             "test": root / "test" / "p.json"}
    with pytest.raises(DataError) as e:
        load_leaf(root)
    assert message.format(**where) in str(e.value) and "\n" not in str(e.value)


def test_valid_variants_load_as_written(tmp_path):
    """LEAF's own forms: integral float labels (its CelebA), a 'hierarchies' key, a user with
    no test rows, a UTF-8 byte-order mark, integers as features."""
    documents = _valid()
    _a(documents)["y"] = [0.0, 1.0]
    _a(documents)["x"][0] = [0, 2 ** 70]
    _train(documents)["hierarchies"] = ["h", "h"]
    del documents["test"]["users"][1], documents["test"]["num_samples"][1]
    del documents["test"]["user_data"]["b"]
    raw = {"train": b"\xef\xbb\xbf" + json.dumps(_train(documents)).encode()}
    ds = load_leaf(_write(tmp_path, documents, raw))
    np.testing.assert_array_equal(ds.arrays.y_train, [0, 1, 2])
    assert np.asarray(ds.arrays.x_train)[0, 1] == np.float32(2 ** 70)
    assert ds.test_counts().tolist() == [1, 0] and ds.client_ids == ("a", "b")


@pytest.mark.parametrize("raw, message", [
    (b'{"users": ["a"], "users": ["b"], "num_samples": [], "user_data": {}}',
     "{path} gives the key 'users' twice in one object; each key may appear once"),
    (json.dumps(_valid()["train"]).encode("utf-16"),
     "{path} is not valid JSON: not UTF-8 text (invalid start byte at byte 0); LEAF files are "
     "UTF-8"),
    (b'{"users": ["\xe9"]}', "{path} is not valid JSON: not UTF-8 text (invalid continuation "
     "byte at byte 12)"),
    (b'{"users": [', "{path} is not valid JSON: Expecting value at line 1, column 12"),
    (b"", "{path} is not valid JSON: Expecting value at line 1, column 1"),
    (b"[" * 100_000 + b"]" * 100_000, "{path} is not a LEAF file: its JSON is nested too deeply"),
    (b'{"users": [' + b"1" * 5000 + b"]}",
     "{path} is not a LEAF file: its JSON holds an integer with too many digits"),
    (b"[]", "{path} must hold a JSON object with keys users, num_samples, user_data"),
])
def test_file_text_problems_name_the_file(tmp_path, raw, message):
    root = _write(tmp_path, _valid(), {"train": raw})
    with pytest.raises(DataError, match=re.escape(message.format(path=root / "train" /
                                                                 "p.json"))):
        load_leaf(root)


def test_layout_problems_name_the_path(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match="LEAF data directory .*file is a file; name the folder"):
        load_leaf(tmp_path / "file")
    (tmp_path / "d" / "test").mkdir(parents=True)
    (tmp_path / "d" / "train").write_text("x")
    with pytest.raises(DataError, match=r"LEAF folder .*d/train is a file; LEAF data needs a "):
        load_leaf(tmp_path / "d")
    root = _write(tmp_path / "e", _valid())
    (root / "train" / "q.json").mkdir()
    with pytest.raises(DataError, match=r"q.json cannot be read: Is a directory"):
        load_leaf(root)
    with pytest.raises(DataError, match=r"asked for 3 clients \(--clients\), but the train "
                                        r"files in .*train hold only 2 users; give at most 2"):
        load_leaf(_write(tmp_path / "f", _valid()), num_clients=3)


def _cli(argv, capsys, tmp_path, monkeypatch) -> str:
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("mcfl: error: "), err
    return err


def test_an_empty_leaf_user_list_is_one_line_through_the_cli(tmp_path, capsys, monkeypatch):
    documents = _valid()
    _train(documents).update(users=[], num_samples=[], user_data={})
    root = _write(tmp_path / "data", documents)
    err = _cli(["run", "--dataset", "leaf", "--data-dir", str(root), "--rounds", "1",
                "--no-cache", "--out", str(tmp_path / "out")], capsys, tmp_path, monkeypatch)
    assert "train list no users" in err and not (tmp_path / "out").exists()


def test_datasets_without_rows_name_the_dataset_and_what_to_change():
    x, y = np.zeros((4, 2), np.float32), np.zeros(4, int)
    with pytest.raises(DataError, match=r"digits: 1 client\(s\) have no data \(first: \[2\]\); "
                                        r"every client needs at least one sample: give fewer "
                                        r"--clients \(it has 4 rows for 3\)"):
        from_owner("digits", x, y, np.array([0, 0, 1, 1]), 3, 2, 0.5, np.random.default_rng(0))
    with pytest.raises(DataError, match=r"digits: 1 of its 2 client\(s\) have no training rows "
                                        r"\(first: \['w2'\]\); every client needs at least one: "
                                        r"give fewer --clients, a smaller --test-fraction"):
        from_splits("digits", (x[:2], y[:2], np.zeros(2)), (x[2:], y[2:], np.ones(2)), 2, 2,
                    client_ids=["w1", "w2"])
    with pytest.raises(DataError, match=r"test fraction \(--test-fraction\) must be a number in "
                                        r"\(0, 1\), got 1.0"):
        split_train_test(np.zeros(3, int), 1, 1.0, np.random.default_rng(0))


@pytest.mark.parametrize("argv, message", [
    (["run", "--dataset", "digits", "--clients", "1797", "--no-cache"],
     "the dataset 'digits/iid' has no test rows for its 1797 client(s); runs are scored on "
     "test rows: give a larger --test-fraction or --samples-per-client, or fewer --clients"),
    (["run", "--hidden", "200,,200"], "argument --hidden: hidden '200,,200' has an empty item; "
     "give values separated by ',', e.g. 200,200"),
    (["run", "--hidden", "200,"], "argument --hidden: hidden '200,' has an empty item"),
    (["run", "--hidden", " "], "argument --hidden: hidden ' ' has an empty item"),
    (["run", "--hidden", "200,2.5"], "argument --hidden: hidden must be comma-separated "
     "integers >= 1 like 200,200, got '200,2.5' ('2.5' is not)"),
    (["run", "--hidden", "true"], "got 'true' ('true' is not)"),
    (["run", "--hidden", "200,0"], "got '200,0' ('0' is not)"),
    (["sweep", "--seeds", "0,,1"], "seeds '0,,1' has an empty item; give values separated by "
     "',', e.g. 0-7 or 0,3,5"),
    (["sweep", "--seeds", "0,1,"], "seeds '0,1,' has an empty item"),
    (["sweep", "--seeds", "0,1,1"], "seeds '0,1,1' gives '1' twice; give each value once"),
    (["sweep", "--seeds", "0-3,2"], "seeds gives the seed 2 twice; give each seed once"),
    (["sweep", "--seeds", "5,7-3"], "seeds '5,7-3': the range '7-3' runs backwards; write it "
     "as 3-7"),
    (["sweep", "--seeds", "2.5"], "seeds must look like 0-7 or 0,3,5, got '2.5' ('2.5' is not "
     "an integer or a range of them)"),
    (["sweep", "--seeds", "true"], "got 'true' ('true' is not an integer or a range of them)"),
    (["sweep", "--seeds", "-1"], "seeds must be integers from 0 to 2^63 - 1, got -1"),
    (["sweep", "--seeds", "0-99999999999"], "seeds '0-99999999999': the range '0-99999999999' "
     "holds 100,000,000,000 seeds; at most 1,000,000 are allowed"),
    (["sweep", "--grid", "lr=0.1,0.10"], "--grid lr gives the value 0.1 twice (as '0.1' and "
     "'0.10'); give each value once"),
    (["sweep", "--grid", "dp-clip-per-layer=true,True"], "--grid dp_clip_per_layer gives the "
     "value True twice (as 'true' and 'True')"),
    (["sweep", "--grid", "hidden=200;0200"], "--grid hidden gives the value (200,) twice"),
    (["sweep", "--grid", "clients=2.5"], "grid clients: '2.5' is not an integer"),
    (["sweep", "--grid", "clients=true"], "grid clients: 'true' is not an integer"),
    (["sweep", "--grid", "lr= , "], "--grid lr ' , ' has an empty item"),
    (["sweep", "--grid", "hidden=200,,1"], "grid hidden: hidden '200,,1' has an empty item"),
    (["select-k", "--k", "2,3,"], "--k '2,3,' has an empty item"),
    (["select-k", "--k", "true"], "--k must be comma-separated integers >= 1, got 'true'"),
    (["run", "--hidden", "0"], "argument --hidden: hidden must be comma-separated integers >= 1 "
     "like 200,200, got '0' ('0' is not)"),
    (["sweep", "--grid", "lr=0.1,,0.2"], "--grid lr '0.1,,0.2' has an empty item"),
    (["sweep", "--grid", "lr=0.1,0.2,"], "--grid lr '0.1,0.2,' has an empty item"),
    (["sweep", "--grid", "lr=0.1,0.1"], "--grid lr '0.1,0.1' gives '0.1' twice"),
    (["sweep", "--grid", "hidden=20;;30"], "--grid hidden '20;;30' has an empty item; give "
     "values separated by ';', e.g. hidden=200,200;100"),
    (["select-k", "--k", "2,,3"], "--k '2,,3' has an empty item"),
    (["select-k", "--k", "2,3,2"], "--k '2,3,2' gives '2' twice"),
    (["select-k", "--k", "2.5"], "--k must be comma-separated integers >= 1, got '2.5'"),
    (["reproduce", "flexcfl-table3-synthetic", "--cells", "FedAvg,"],
     "--cells 'FedAvg,' has an empty item"),
    (["bench", "--clients", "100,,200"], "the client counts '100,,200' has an empty item"),
    (["bench", "--algorithms", "fedavg,fedavg"], "gives 'fedavg' twice"),
    (["run", "--dataset", "digits", "--clients", "10", "--samples-per-client", "1", "--no-cache"],
     "the dataset 'digits/iid' has no test rows for its 10 client(s); runs are scored on test "
     "rows: give a larger --test-fraction or --samples-per-client, or fewer --clients"),
])
def test_list_values_name_the_flag_the_value_and_what_is_allowed(argv, message, capsys,
                                                                  tmp_path, monkeypatch):
    if argv[0] == "sweep":
        argv = [*argv, "--clients", "12", "--rounds", "1", "--no-cache", "--out", "s"]
    err = _cli(argv, capsys, tmp_path, monkeypatch)
    assert message in err, err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("value, message", [
    ("200,,200", "hidden '200,,200' has an empty item"),
    ([200, True], "hidden must be a list of positive integers like 200,200, got [200, True]"),
    ([], "hidden must be a list of positive integers like 200,200, got []"),
    ("200;100", "hidden must be comma-separated integers >= 1 like 200,200, got '200;100'"),
])
def test_list_values_in_config_files(value, message, capsys, tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": "mlp", "hidden": value}))
    err = _cli(["run", "--config", str(path)], capsys, tmp_path, monkeypatch)
    assert message in err, err


def test_list_parsers_keep_valid_syntax_and_refuse_the_rest():
    assert parse_int_list("200, 100") == (200, 100) and parse_int_list([5]) == (5,)
    assert parse_int_list("200,200") == (200, 200)  # widths may repeat
    assert parse_seeds(" 0 - 2 ,5") == (0, 1, 2, 5) and parse_seeds(2) == (0, 1)
    assert parse_grid("clients-per-round=1,1.0") == ("clients_per_round", (1, 1.0))  # count,
    for bad, message in [(10 ** 12, "seeds as a count must be from 1 to 1,000,000"),  # fraction
                         ([True], "seeds must be integers from 0 to 2^63 - 1, got True"),
                         ([2 ** 63], "got 9223372036854775808"),
                         (None, "seeds must be a count, a list of integers or text"),
                         ({"a": 1}, "seeds must be a count, a list of integers or text")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            parse_seeds(bad)
    with pytest.raises(ConfigError, match=re.escape("data_seeds '1,,2' has an empty item")):
        parse_seeds("1,,2", "data_seeds")
    with pytest.raises(ConfigError, match=re.escape("grid lr gives the value 0.1 twice")):
        check_grid({"lr": [0.1, 0.1]})
    with pytest.raises(ConfigError, match=re.escape("grid hidden gives the value [200] twice")):
        check_grid({"hidden": [[200], [200]]})
