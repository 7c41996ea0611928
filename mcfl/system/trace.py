"""Device trace files: each simulated client's device (speed, network, availability).

A trace gives every client of the population, once, its

- ``speed``: local training steps per simulated second (a finite number > 0);
- ``bandwidth``: megabytes per second, the same both ways (a number > 0; ``inf`` for a
  network that costs no time);
- ``latency``: seconds added to every message (a finite number >= 0; 0 when not given);
- ``online``: when it is available, as intervals ``start-end`` in seconds within a repeating
  cycle (e.g. a day of 86400 s); none given means always online. Each interval has
  ``0 <= start < end`` (and ``end <= period`` when `read_trace` is given a period); the
  intervals of a client must not overlap (touching ends, ``0-10;10-20``, is allowed).

Client ids are the integers ``0 .. num_clients - 1``, each exactly once, in any order; the
arrays that `read_trace` returns are ordered by client id. The file is UTF-8 (a leading BOM is
ignored) and its name ends in ``.csv`` or ``.json``, which picks the format.

CSV (``.csv``): a header row naming the columns, then one row per client. ``client``,
``speed`` and ``bandwidth`` are required; ``latency`` and ``online`` are optional; any other
column is an error. Cells are stripped of spaces; numbers are written as Python's ``float``
reads them (``2``, ``0.5``, ``1e3``, ``inf``). ``online`` is a ``;``-separated list of
``start-end`` intervals; an empty ``online`` cell means always online, and an empty
``latency`` cell means 0. Blank lines are skipped; errors name the data row (1-based, the
header not counted) and its line in the file::

    client,speed,bandwidth,latency,online
    0,2.0,5.0,0.1,0-3600;7200-9000
    1,1.5,inf,0,
    2,4,0.5,0.25,43200-86400

JSON (``.json``): an object whose only key is ``"clients"``, a list with one object per
client; each has ``"client"`` (an integer), ``"speed"``, ``"bandwidth"`` (numbers; the
bandwidth may also be the string ``"inf"`` or the literal ``Infinity``), and optionally
``"latency"`` (a number, default 0) and ``"online"`` (a non-empty list of ``[start, end]``
pairs; missing or ``null`` means always online). Any other key, or a key given twice, is an
error; ``true`` / ``false`` are not numbers. Errors name the entry by its index in the list,
``clients[0]`` being the first::

    {"clients": [
        {"client": 0, "speed": 2.0, "bandwidth": 5.0, "latency": 0.1,
         "online": [[0, 3600], [7200, 9000]]},
        {"client": 1, "speed": 1.5, "bandwidth": "inf"},
        {"client": 2, "speed": 4, "bandwidth": 0.5, "latency": 0.25, "online": [[43200, 86400]]}
    ]}

Every problem raises `mcfl.errors.ConfigError` with one line naming the file, the row or
entry, the offending value and what is allowed.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from typing import NamedTuple

import numpy as np

from mcfl.errors import ConfigError

COLUMNS = ("client", "speed", "bandwidth", "latency", "online")
REQUIRED = ("client", "speed", "bandwidth")
# Per field: what is allowed (for messages) and the test a parsed float must pass.
_NUMBERS = {
    "speed": ("a finite number > 0", lambda x: math.isfinite(x) and x > 0),
    "bandwidth": ("a number > 0 or inf (not NaN)", lambda x: x > 0),
    "latency": ("a finite number >= 0", lambda x: math.isfinite(x) and x >= 0),
}
_INTEGER = re.compile(r"[+-]?[0-9]+")
_INFINITY = {"inf", "+inf", "infinity", "+infinity"}
_SHOWN_CHARS = 60


class DeviceTrace(NamedTuple):
    """Every client's device, ordered by client id (C clients, J the most intervals any has)."""

    speed: np.ndarray  # [C] float64, > 0, finite: local steps per second
    bandwidth: np.ndarray  # [C] float64, > 0, may be inf: megabytes per second
    latency: np.ndarray  # [C] float64, >= 0: seconds per message
    online: np.ndarray  # [C, J, 2] float64 (start, end), sorted by start, padded with (0, 0)
    online_count: np.ndarray  # [C] int32: real intervals in `online`; 0 = always online

    @property
    def has_availability(self) -> bool:
        """Whether any client is offline some of the time."""
        return bool(np.any(self.online_count > 0))


class _Client(NamedTuple):
    where: str
    client: int
    speed: float
    bandwidth: float
    latency: float
    online: list  # of (start, end), sorted, or empty for always online


def read_trace(path, num_clients: int, period: float | None = None) -> DeviceTrace:
    """The device trace at `path` (``.csv`` or ``.json``, see the module docstring) for a
    population of `num_clients`; `period`, when given, bounds the availability intervals'
    ends (the length of the cycle they repeat in). `online` has J = max(1, most intervals of
    any client) slots, so its shape is never empty."""
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) \
            or num_clients < 1:
        raise ConfigError(f"device trace {path}: num_clients={num_clients!r}; allowed: an "
                          f"integer >= 1")
    if period is not None and (isinstance(period, bool) or not isinstance(
            period, (int, float, np.integer, np.floating)) or not (0 < period < math.inf)):
        raise ConfigError(f"device trace {path}: period={period!r}; allowed: a finite number "
                          f"of seconds > 0, or None")
    fail = _Failer(path)
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in (".csv", ".json"):
        raise fail.at(None, f"file extension {suffix!r} is not known; allowed: .csv, .json")
    text = _read_text(path, fail)
    entries = _csv_entries(text, fail) if suffix == ".csv" else _json_entries(text, fail)
    reader = _EntryReader(fail, int(num_clients), period, text_cells=suffix == ".csv")
    clients = [reader.client(where, fields) for where, fields in entries]
    return _assemble(clients, int(num_clients), fail, "row" if suffix == ".csv" else "entry")


class _Failer:
    """Builds the one-line errors that name the file."""

    def __init__(self, path):
        self.path = os.fspath(path)

    def at(self, where: str | None, message: str) -> ConfigError:
        place = f"device trace {self.path}" + (f": {where}" if where else "")
        return ConfigError(f"{place}: {message}")


def _shown(value) -> str:
    """`value` for a message: its repr, on one line, shortened."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."


def _read_text(path, fail: _Failer) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise fail.at(None, "no such file; allowed: an existing .csv or .json file") from None
    except OSError as e:
        raise fail.at(None, f"cannot be read ({e.strerror or e}); allowed: a readable "
                            f"file") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise fail.at(None, f"byte {data[e.start:e.start + 1]!r} at offset {e.start} is not "
                            f"UTF-8; allowed: a UTF-8 text file") from None
    if not text.strip():
        raise fail.at(None, "the file is empty; allowed: a header and one row per client "
                            "(.csv), or {\"clients\": [...]} (.json)")
    return text


def _csv_entries(text: str, fail: _Failer) -> list[tuple[str, dict]]:
    """(where, {column: stripped cell}) for each data row; checks the header and the shape."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader)
        while not header:
            header = next(reader)
        columns = [name.strip() for name in header]
        for name in columns:
            if name not in COLUMNS:
                raise fail.at("header", f"unknown column {_shown(name)}; allowed: "
                                        f"{', '.join(COLUMNS)}")
            if columns.count(name) > 1:
                raise fail.at("header", f"column {name!r} appears twice; allowed: each "
                                        f"column once")
        missing = [name for name in REQUIRED if name not in columns]
        if missing:
            raise fail.at("header", f"required column(s) {', '.join(missing)} missing (header "
                                    f"{_shown(','.join(columns))}); allowed: columns "
                                    f"{', '.join(COLUMNS)}, the first three required")
        entries = []
        for row in reader:
            if len(row) <= 1 and not "".join(row).strip():
                continue
            where = f"row {len(entries) + 1} (line {reader.line_num})"
            if len(row) != len(columns):
                raise fail.at(where, f"{len(row)} cells {_shown(','.join(row))}; allowed: "
                                     f"{len(columns)} cells, one per header column")
            entries.append((where, {name: cell.strip() for name, cell in zip(columns, row)}))
    except csv.Error as e:
        raise fail.at(f"line {reader.line_num}", f"malformed CSV ({e}); allowed: "
                                                 f"comma-separated cells, quoted with \"") \
            from None
    except StopIteration:
        raise AssertionError("a non-blank text has a first row") from None
    return entries


def _json_entries(text: str, fail: _Failer) -> list[tuple[str, dict]]:
    """(where, entry) for each object of the "clients" list; checks the outer shape."""

    def unique_keys(pairs):
        keys = [key for key, _ in pairs]
        for key in keys:
            if keys.count(key) > 1:
                raise fail.at(None, f"key {key!r} appears twice in an object; allowed: each "
                                    f"key once")
        return dict(pairs)

    try:
        document = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as e:
        raise fail.at(f"line {e.lineno} column {e.colno}",
                      f"malformed JSON ({e.msg}); allowed: {{\"clients\": [...]}}") from None
    except RecursionError:
        raise fail.at(None, "JSON nested too deeply; allowed: {\"clients\": [...]}") from None
    if not isinstance(document, dict) or set(document) != {"clients"}:
        keys = sorted(document) if isinstance(document, dict) else type(document).__name__
        raise fail.at(None, f"top level {_shown(keys)}; allowed: an object with the single "
                            f"key \"clients\"")
    clients = document["clients"]
    if not isinstance(clients, list):
        raise fail.at("clients", f"{_shown(clients)} is not a list; allowed: a list of "
                                 f"objects, one per client")
    entries = []
    for index, entry in enumerate(clients):
        where = f"clients[{index}]"
        if not isinstance(entry, dict):
            raise fail.at(where, f"{_shown(entry)} is not an object; allowed: "
                                 f"{{\"client\": ..., \"speed\": ..., \"bandwidth\": ...}}")
        for key in entry:
            if key not in COLUMNS:
                raise fail.at(where, f"unknown key {_shown(key)}; allowed: "
                                     f"{', '.join(COLUMNS)}")
        missing = [key for key in REQUIRED if key not in entry]
        if missing:
            raise fail.at(where, f"key(s) {', '.join(missing)} missing; allowed: an object "
                                 f"with client, speed, bandwidth and optionally latency, "
                                 f"online")
        entries.append((where, entry))
    return entries


class _EntryReader:
    """Turns one row or entry (CSV cells, or JSON values) into a checked `_Client`."""

    def __init__(self, fail: _Failer, num_clients: int, period, text_cells: bool):
        self.fail = fail
        self.num_clients = num_clients
        self.period = None if period is None else float(period)
        self.text_cells = text_cells

    def client(self, where: str, fields: dict) -> _Client:
        latency = fields.get("latency", 0.0)
        if self.text_cells and latency == "":
            latency = 0.0
        return _Client(where, self.client_id(where, fields["client"]),
                       self.number(where, "speed", fields["speed"]),
                       self.number(where, "bandwidth", fields["bandwidth"]),
                       self.number(where, "latency", latency),
                       self.intervals(where, fields.get("online")))

    def client_id(self, where: str, raw) -> int:
        allowed = f"an integer in 0..{self.num_clients - 1} (num_clients={self.num_clients})"
        if self.text_cells:
            value = int(raw) if _INTEGER.fullmatch(raw) else None
        else:
            value = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
        if value is None:
            raise self.fail.at(where, f"client {_shown(raw)} is not an integer; allowed: "
                                      f"{allowed}")
        if not 0 <= value < self.num_clients:
            raise self.fail.at(where, f"client {_shown(raw)} is outside the population; "
                                      f"allowed: {allowed}")
        return value

    def number(self, where: str, field: str, raw) -> float:
        allowed, ok = _NUMBERS[field]
        value = self.to_float(raw)
        if value is None:
            raise self.fail.at(where, f"{field} {_shown(raw)} is not a number; allowed: "
                                      f"{allowed}")
        if not ok(value):
            raise self.fail.at(where, f"{field} {_shown(raw)} is out of range; allowed: "
                                      f"{allowed}")
        return value

    def to_float(self, raw) -> float | None:
        """`raw` as a float; None when it is not a number (booleans are not)."""
        if isinstance(raw, str) and not self.text_cells:
            return math.inf if raw.strip().lower() in _INFINITY else None
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            return None
        try:
            return float(raw)
        except (ValueError, OverflowError):
            return None

    def intervals(self, where: str, raw) -> list[tuple[float, float]]:
        """The availability intervals, sorted by start; [] for always online."""
        if raw is None or (self.text_cells and raw == ""):
            return []
        if self.text_cells:
            pairs = [(part.strip(), _split_interval(part.strip())) for part in raw.split(";")]
        else:
            if not isinstance(raw, list) or not raw:
                raise self.fail.at(where, f"online {_shown(raw)} is not a non-empty list; "
                                          f"allowed: a list of [start, end] pairs, or no "
                                          f"\"online\" key for always online")
            pairs = [(pair, tuple(pair) if isinstance(pair, list) and len(pair) == 2 else None)
                     for pair in raw]
        intervals = []
        for shown, bounds in pairs:
            start, end = (None, None) if bounds is None else map(self.to_float, bounds)
            intervals.append((shown, self.interval(where, shown, start, end)))
        intervals.sort(key=lambda item: item[1])
        for (shown_a, a), (shown_b, b) in zip(intervals, intervals[1:]):
            if b[0] < a[1]:
                raise self.fail.at(where, f"online intervals {_shown(shown_a)} and "
                                          f"{_shown(shown_b)} overlap; allowed: disjoint "
                                          f"intervals")
        return [bounds for _, bounds in intervals]

    def interval(self, where: str, shown, start, end) -> tuple[float, float]:
        limit = "" if self.period is None else f" <= period {self.period:g}"
        form = "start-end" if self.text_cells else "[start, end]"
        allowed = f"{form} with 0 <= start < end{limit}, in seconds"
        if start is None or end is None:
            problem = "is not a pair of numbers"
        elif not (math.isfinite(start) and math.isfinite(end)):
            problem = "has a bound that is not finite"
        elif start < 0:
            problem = "starts before 0"
        elif not start < end:
            problem = "does not end after its start"
        elif self.period is not None and end > self.period:
            problem = "ends after the period"
        else:
            return start, end
        raise self.fail.at(where, f"online interval {_shown(shown)} {problem}; allowed: "
                                  f"{allowed}")


def _split_interval(text: str) -> tuple[str, str] | None:
    """``"start-end"`` as its two number texts (at the first ``-`` that leaves two numbers,
    so ``1e-3-5`` and ``-1-5`` split right); None when no ``-`` does."""
    for i, char in enumerate(text):
        if char == "-" and i > 0:
            start, end = text[:i].strip(), text[i + 1:].strip()
            try:
                float(start), float(end)
            except ValueError:
                continue
            return start, end
    return None


def _assemble(clients: list[_Client], num_clients: int, fail: _Failer, noun: str
              ) -> DeviceTrace:
    """The arrays, ordered by client id; refuses a duplicate or a missing client."""
    first: dict[int, _Client] = {}
    for c in clients:
        if c.client in first:
            raise fail.at(c.where, f"client {c.client} appears again (first at "
                                   f"{first[c.client].where}); allowed: each client once")
        first[c.client] = c
    missing = [i for i in range(num_clients) if i not in first]
    if missing:
        listed = ", ".join(map(str, missing[:10])) + (
            f", ... ({len(missing)} in all)" if len(missing) > 10 else "")
        raise fail.at(None, f"no {noun} for client(s) {listed}; allowed: every client "
                            f"0..{num_clients - 1} exactly once")
    ordered = [first[i] for i in range(num_clients)]
    slots = max(1, max(len(c.online) for c in ordered))
    online = np.zeros((num_clients, slots, 2), np.float64)
    for i, c in enumerate(ordered):
        if c.online:
            online[i, :len(c.online)] = c.online
    return DeviceTrace(
        speed=np.array([c.speed for c in ordered], np.float64),
        bandwidth=np.array([c.bandwidth for c in ordered], np.float64),
        latency=np.array([c.latency for c in ordered], np.float64),
        online=online,
        online_count=np.array([len(c.online) for c in ordered], np.int32))
