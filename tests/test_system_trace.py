"""Device trace files (mcfl.system.trace): a CSV and a JSON trace read back to the exact
arrays, ordered by client id; every bad input is refused with one line naming the file, the
row or entry and the offending value."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mcfl.errors import ConfigError
from mcfl.system.trace import DeviceTrace, read_trace

CSV = """client,speed,bandwidth,latency,online
2,4,0.5,0.25,43200-86400
0,2.0,5.0,0.1,7200-9000;0-3600
1,1.5,inf,0,
"""

JSON = {"clients": [
    {"client": 1, "speed": 1.5, "bandwidth": "inf"},
    {"client": 2, "speed": 4, "bandwidth": 0.5, "latency": 0.25, "online": [[43200, 86400]]},
    {"client": 0, "speed": 2.0, "bandwidth": 5.0, "latency": 0.1,
     "online": [[7200, 9000], [0, 3600]]},
]}

EXPECTED = DeviceTrace(
    speed=np.array([2.0, 1.5, 4.0]),
    bandwidth=np.array([5.0, np.inf, 0.5]),
    latency=np.array([0.1, 0.0, 0.25]),
    online=np.array([[[0.0, 3600.0], [7200.0, 9000.0]],
                     [[0.0, 0.0], [0.0, 0.0]],
                     [[43200.0, 86400.0], [0.0, 0.0]]]),
    online_count=np.array([2, 0, 1], np.int32))


def write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content),
                        encoding="utf-8")
    return path


def assert_same(trace: DeviceTrace, expected: DeviceTrace):
    for name in DeviceTrace._fields:
        got, want = getattr(trace, name), getattr(expected, name)
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("name,content", [("trace.csv", CSV), ("trace.json", JSON)])
def test_reads_back_exact_arrays(tmp_path, name, content):
    trace = read_trace(write(tmp_path, name, content), 3, period=86400)
    assert_same(trace, EXPECTED)
    assert trace.has_availability


def test_rows_out_of_order_come_back_ordered_by_client(tmp_path):
    rows = "client,speed,bandwidth\n" + "".join(f"{c},{c + 1},{10 * (c + 1)}\n"
                                                 for c in (3, 0, 4, 2, 1))
    trace = read_trace(write(tmp_path, "t.csv", rows), 5)
    np.testing.assert_array_equal(trace.speed, [1.0, 2.0, 3.0, 4.0, 5.0])
    np.testing.assert_array_equal(trace.bandwidth, [10.0, 20.0, 30.0, 40.0, 50.0])


def test_optional_columns_default_to_zero_latency_and_always_online(tmp_path):
    """No latency or online column: latency 0, one (0, 0) padding slot, no availability;
    blank lines, spaces and a BOM are ignored; without a period, ends are unbounded."""
    trace = read_trace(write(tmp_path, "t.csv", "\ufeffclient, speed ,bandwidth\n\n"
                                                " 1 , 2 , 3 \n0,1e0,inf\n"), 2)
    assert_same(trace, DeviceTrace(
        speed=np.array([1.0, 2.0]), bandwidth=np.array([np.inf, 3.0]),
        latency=np.zeros(2), online=np.zeros((2, 1, 2)),
        online_count=np.zeros(2, np.int32)))
    assert not trace.has_availability
    long = read_trace(write(tmp_path, "l.json", {"clients": [
        {"client": 0, "speed": 1, "bandwidth": 1, "online": None},
        {"client": 1, "speed": 1, "bandwidth": 1, "online": [[1e-3, 1e9], [0, 1e-3]]}]}), 2)
    np.testing.assert_array_equal(long.online, [[[0, 0], [0, 0]], [[0, 1e-3], [1e-3, 1e9]]])
    np.testing.assert_array_equal(long.online_count, [0, 2])


def test_csv_interval_bounds_may_use_exponents(tmp_path):
    trace = read_trace(write(tmp_path, "t.csv", "client,speed,bandwidth,online\n"
                                                "0,1,1, 1e-3 - 2.5e3 ;5e3-6e3\n"), 1)
    np.testing.assert_array_equal(trace.online, [[[1e-3, 2.5e3], [5e3, 6e3]]])


HEAD = "client,speed,bandwidth,latency,online\n"
GOOD = "0,1,1,0,\n1,1,1,0,\n"


def entry(**fields):
    base = {"client": 0, "speed": 1.0, "bandwidth": 1.0}
    base.update(fields)
    return {"clients": [base, {"client": 1, "speed": 1.0, "bandwidth": 1.0}]}


# (id, file name, content, what the message must name besides the file)
BAD = [
    # the file itself
    ("wrong-extension", "trace.txt", HEAD + GOOD, ["'.txt'", ".csv, .json"]),
    ("empty", "t.csv", "", ["empty"]),
    ("blank", "t.json", " \n\t\n", ["empty"]),
    ("not-utf8", "t.csv", HEAD.encode() + b"0,1,1,0,\xff\n", ["b'\\xff'", "UTF-8"]),
    ("csv-unclosed-quote", "t.csv", HEAD + '0,"1,1,0,\n', ["malformed CSV"]),
    ("csv-stray-quote", "t.csv", HEAD + '0,"1"x,1,0,\n1,1,1,0,\n', ["line 2", "malformed"]),
    ("json-malformed", "t.json", '{"clients": [', ["malformed JSON", "line 1"]),
    ("json-top-not-object", "t.json", [1, 2], ["'list'", '"clients"']),
    ("json-top-unknown-key", "t.json", {"clients": [], "extra": 1}, ["'extra'"]),
    ("json-clients-not-list", "t.json", {"clients": {"a": 1}}, ["{'a': 1}", "not a list"]),
    ("json-entry-not-object", "t.json", {"clients": [[0, 1, 1]]}, ["clients[0]", "[0, 1, 1]"]),
    ("json-duplicate-key", "t.json",
     '{"clients": [{"client": 0, "speed": 1, "speed": 2, "bandwidth": 1}]}', ["'speed'"]),
    # columns and keys
    ("csv-unknown-column", "t.csv", "client,speed,bandwidth,colour\n0,1,1,red\n1,1,1,red\n",
     ["header", "'colour'", "client, speed, bandwidth, latency, online"]),
    ("csv-missing-column", "t.csv", "client,speed\n0,1\n1,1\n", ["header", "bandwidth"]),
    ("csv-duplicate-column", "t.csv", "client,speed,bandwidth,speed\n0,1,1,1\n",
     ["header", "'speed'", "twice"]),
    ("csv-cell-count", "t.csv", HEAD + "0,1,1,0\n1,1,1,0,\n", ["row 1 (line 2)", "'0,1,1,0'"]),
    ("json-unknown-key", "t.json", entry(colour="red"), ["clients[0]", "'colour'"]),
    ("json-missing-key", "t.json", {"clients": [{"client": 0, "speed": 1}]},
     ["clients[0]", "bandwidth"]),
    # client ids
    ("csv-client-not-int", "t.csv", HEAD + "0,1,1,0,\n1.5,1,1,0,\n",
     ["row 2", "client '1.5'", "0..1"]),
    ("csv-client-outside", "t.csv", HEAD + GOOD + "7,1,1,0,\n", ["row 3", "client '7'", "0..1"]),
    ("csv-client-negative", "t.csv", HEAD + "-1,1,1,0,\n1,1,1,0,\n",
     ["row 1", "client '-1'", "outside"]),
    ("csv-client-duplicate", "t.csv", HEAD + GOOD + "1,2,2,0,\n",
     ["row 3", "client 1 appears again", "row 2"]),
    ("csv-client-missing", "t.csv", HEAD + "1,1,1,0,\n", ["client(s) 0", "0..1"]),
    ("json-client-missing", "t.json", {"clients": []}, ["entry for client(s) 0, 1"]),
    ("json-client-bool", "t.json", entry(client=True), ["clients[0]", "client True"]),
    ("json-client-float", "t.json", entry(client=0.0), ["clients[0]", "client 0.0"]),
    ("json-client-outside", "t.json", entry(client=2), ["clients[0]", "client 2", "outside"]),
    ("json-client-duplicate", "t.json", entry(client=1),
     ["clients[1]", "client 1 appears again", "clients[0]"]),
    # speed, bandwidth, latency
    ("csv-speed-zero", "t.csv", HEAD + "0,0,1,0,\n1,1,1,0,\n", ["row 1", "speed '0'", "> 0"]),
    ("csv-speed-negative", "t.csv", HEAD + "0,-2,1,0,\n1,1,1,0,\n", ["speed '-2'"]),
    ("csv-speed-inf", "t.csv", HEAD + "0,inf,1,0,\n1,1,1,0,\n", ["speed 'inf'", "finite"]),
    ("csv-speed-nan", "t.csv", HEAD + "0,nan,1,0,\n1,1,1,0,\n", ["speed 'nan'"]),
    ("csv-speed-text", "t.csv", HEAD + "0,fast,1,0,\n1,1,1,0,\n", ["speed 'fast'", "not a number"]),
    ("csv-speed-empty", "t.csv", HEAD + "0,,1,0,\n1,1,1,0,\n", ["speed ''", "not a number"]),
    ("csv-bandwidth-zero", "t.csv", HEAD + "0,1,0,0,\n1,1,1,0,\n", ["bandwidth '0'"]),
    ("csv-bandwidth-nan", "t.csv", HEAD + "0,1,NaN,0,\n1,1,1,0,\n", ["bandwidth 'NaN'"]),
    ("csv-bandwidth-bool", "t.csv", HEAD + "0,1,true,0,\n1,1,1,0,\n", ["bandwidth 'true'"]),
    ("csv-latency-negative", "t.csv", HEAD + "0,1,1,-0.5,\n1,1,1,0,\n",
     ["latency '-0.5'", ">= 0"]),
    ("csv-latency-inf", "t.csv", HEAD + "0,1,1,inf,\n1,1,1,0,\n", ["latency 'inf'", "finite"]),
    ("json-speed-bool", "t.json", entry(speed=True), ["clients[0]", "speed True"]),
    ("json-speed-string", "t.json", entry(speed="2"), ["speed '2'", "not a number"]),
    ("json-speed-nan", "t.json", '{"clients": [{"client": 0, "speed": NaN, "bandwidth": 1}]}',
     ["speed nan"]),
    ("json-speed-infinity", "t.json", entry(speed="inf"), ["speed 'inf'", "finite"]),
    ("json-bandwidth-negative", "t.json", entry(bandwidth=-1), ["bandwidth -1"]),
    ("json-bandwidth-null", "t.json", entry(bandwidth=None), ["bandwidth None"]),
    ("json-latency-bool", "t.json", entry(latency=False), ["latency False"]),
    ("json-latency-negative", "t.json", entry(latency=-0.1), ["latency -0.1"]),
    # availability intervals
    ("csv-interval-garbage", "t.csv", HEAD + "0,1,1,0,morning\n1,1,1,0,\n",
     ["row 1", "interval 'morning'"]),
    ("csv-interval-trailing-semicolon", "t.csv", HEAD + "0,1,1,0,0-10;\n1,1,1,0,\n",
     ["interval ''", "pair of numbers"]),
    ("csv-interval-negative-start", "t.csv", HEAD + "0,1,1,0,-5-10\n1,1,1,0,\n",
     ["interval '-5-10'", "0 <= start"]),
    ("csv-interval-reversed", "t.csv", HEAD + "0,1,1,0,3600-0\n1,1,1,0,\n",
     ["interval '3600-0'", "start < end"]),
    ("csv-interval-empty", "t.csv", HEAD + "0,1,1,0,5-5\n1,1,1,0,\n", ["interval '5-5'"]),
    ("csv-interval-past-period", "t.csv", HEAD + "0,1,1,0,0-90000\n1,1,1,0,\n",
     ["interval '0-90000'", "period 86400"]),
    ("csv-interval-nan", "t.csv", HEAD + "0,1,1,0,0-nan\n1,1,1,0,\n", ["interval '0-nan'"]),
    ("csv-intervals-overlap", "t.csv", HEAD + "0,1,1,0,50-200;0-100\n1,1,1,0,\n",
     ["row 1", "'0-100' and '50-200' overlap"]),
    ("json-online-empty", "t.json", entry(online=[]), ["clients[0]", "online []"]),
    ("json-online-not-list", "t.json", entry(online="0-10"), ["online '0-10'"]),
    ("json-interval-not-pair", "t.json", entry(online=[[0, 10, 20]]), ["interval [0, 10, 20]"]),
    ("json-interval-bool", "t.json", entry(online=[[False, 10]]), ["interval [False, 10]"]),
    ("json-interval-reversed", "t.json", entry(online=[[10, 0]]), ["interval [10, 0]"]),
    ("json-interval-past-period", "t.json", entry(online=[[0, 86401]]),
     ["interval [0, 86401]", "period 86400"]),
    ("json-intervals-overlap", "t.json", entry(online=[[0, 10], [5, 20]]),
     ["clients[0]", "[0, 10] and [5, 20] overlap"]),
]


@pytest.mark.parametrize("name,content,named", [case[1:] for case in BAD],
                         ids=[case[0] for case in BAD])
def test_bad_input_is_refused_in_one_line_naming_the_value(tmp_path, name, content, named):
    path = write(tmp_path, name, content)
    with pytest.raises(ConfigError) as error:
        read_trace(path, 2, period=86400)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"device trace {path}")
    for text in named:
        assert text in message, (text, message)


@pytest.mark.parametrize("make,named", [
    (lambda tmp_path: tmp_path / "absent.csv", "no such file"),
    (lambda tmp_path: (tmp_path / "folder.json").mkdir() or tmp_path / "folder.json",
     "cannot be read"),
])
def test_missing_or_unreadable_file_is_refused(tmp_path, make, named):
    path = make(tmp_path)
    with pytest.raises(ConfigError, match=named) as error:
        read_trace(path, 2)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("num_clients,period,named", [
    (0, None, "num_clients=0"), (True, None, "num_clients=True"),
    (2, 0.0, "period=0.0"), (2, float("inf"), "period=inf"), (2, float("nan"), "period=nan"),
])
def test_bad_arguments_are_refused(tmp_path, num_clients, period, named):
    with pytest.raises(ConfigError, match=named):
        read_trace(write(tmp_path, "t.csv", HEAD + GOOD), num_clients, period)
