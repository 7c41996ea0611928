"""Memory a run needs, estimated before it is allocated, and what this machine has.

Two checks refuse a run that cannot fit, each with one line giving the figure and what to
change, instead of an out-of-memory error after a long build:

- `check_data_fits(spec)`, before the dataset is built: its rows (on the device) and the
  generator's temporaries (on the host), from the data's settings alone (`data_bytes`;
  `data_fit` gives
  the figures, which `mcfl plan` prints for a run that cannot fit). For Synthetic
  the clients' sizes are drawn exactly as the generator draws them; array datasets are bounded
  by their source; LEAF folders by the size of their files.
- `check_program_fits(...)`, after a program is compiled and before it runs: XLA's own
  figure of the bytes it allocates beyond its live arguments (the state, the rounds'
  temporaries).

The budget is the accelerator's free memory, or on CPU the host's available memory
(``MemAvailable``); ``with limited(LIMIT):`` sets it for the code in its block (a shared
machine, a test): bytes, or a text with a K / M / G / T suffix. The command line takes the
limit from ``MCFL_MEMORY_LIMIT`` (read in `mcfl.apps.user_environment`, not here: nothing in
this module reads the environment). An out-of-memory error that happens anyway is turned
into one line (`out_of_memory`).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple, Optional, Union

import jax
import numpy as np

from mcfl.data import fedem_synthetic as fedem
from mcfl.errors import ConfigError, McflError

# The command line's variable for `limited` (read by mcfl.apps.user_environment; named here in
# the refusals' advice).
LIMIT_VARIABLE = "MCFL_MEMORY_LIMIT"
_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# Synthetic(alpha, beta)'s generator (mcfl.data.synthetic): rows of 60 float32 features, and
# per client float64 temporaries: a 60 x 10 model, 10 biases, 60 input means, a few scalars.
_SYNTHETIC_ROW_BYTES = 60 * 4 + 3 * 4  # features, label, owner, order
_SYNTHETIC_CLIENT_HOST_BYTES = (600 + 10 + 60 + 8) * 8
# FedEM's synthetic generator (mcfl.data.fedem_synthetic): rows of 150 float32 features; on the
# host, per row, int64 / float64 temporaries (owner, rank, component, shuffle keys and order,
# noise).
# Rows x features of the array datasets' sources (their largest form: official train + test).
_SOURCE_SHAPES = {"mnist": (70_000, 784), "fmnist": (70_000, 784), "mnist5k": (5_000, 784),
                  "digits": (1_797, 64), "tfds:mnist": (70_000, 784),
                  "tfds:fashion_mnist": (70_000, 784), "tfds:emnist": (814_255, 784),
                  "tfds:cifar10": (60_000, 3072), "tfds:cifar100": (60_000, 3072),
                  "cifar10": (60_000, 3072), "cifar100": (60_000, 3072),
                  "tfds:celeb_a": (202_599, 84 * 84 * 3)}


class Need(NamedTuple):
    """Bytes a part of a run needs on the device and on the host, and what it is."""

    device: int
    host: int
    what: str


def parse_size(text: str, name: str = LIMIT_VARIABLE) -> int:
    """'2G' -> 2147483648; an error naming `name` for anything else."""
    value = str(text).strip().upper().removesuffix("B")
    suffix = value[-1:] if value[-1:] in _SUFFIXES else ""
    try:
        number = float(value[:len(value) - len(suffix)])
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(f"{name}={text!r} is not a size in bytes (e.g. 8G, 512M, 1e9)")
    return int(number * _SUFFIXES[suffix])


# The budget `limited` sets (None: the machine's own figures). One for the process: the runs,
# sweeps and stores that ask for the free memory take no limit of their own.
_limit_bytes: Optional[int] = None


@contextlib.contextmanager
def limited(limit: Union[int, str, None]) -> Iterator[Optional[int]]:
    """Take `limit` (bytes, or a size text such as "8G"; None: no limit) as this machine's
    memory for the checks run in the block; the limit before it is back after. Yields the
    limit in bytes."""
    global _limit_bytes
    previous = _limit_bytes
    _limit_bytes = None if limit is None else (
        parse_size(limit) if isinstance(limit, str) else int(limit))
    try:
        yield _limit_bytes
    finally:
        _limit_bytes = previous


def host_available() -> int:
    """The host's available memory (MemAvailable), or the limit `limited` set."""
    if _limit_bytes is not None:
        return _limit_bytes
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info["MemAvailable"]
    except (OSError, KeyError, ValueError, IndexError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def device_available(resident: int = 0) -> int:
    """Free memory of this process's first device (an accelerator's own; on CPU the host's)
    for a run whose arrays already take `resident` bytes there (under a limit (`limited`), the
    limit is the run's whole budget: its resident arrays count against it)."""
    stats = getattr(jax.local_devices()[0], "memory_stats", lambda: None)()
    if stats and "bytes_limit" in stats:
        free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    else:
        free = host_available()
    if _limit_bytes is not None:
        free = min(free, _limit_bytes - resident)
    return int(free)


def on_host() -> bool:
    """Whether device arrays live in host memory (the CPU backend)."""
    return jax.default_backend() == "cpu"


def data_bytes(spec) -> Optional[Need]:
    """What building the dataset of `spec` (a `mcfl.data.DataSpec`) takes, from its settings
    alone; None where the source cannot say before it is read (a TFDS or user folder)."""
    clients = spec.clients or 0
    per_client = 4 * (6 + 10)  # offsets, counts, label counts (10 classes) ... per client
    if spec.dataset == "synthetic":
        rows = _synthetic_rows(clients, spec.seed)
        return Need(rows * _SYNTHETIC_ROW_BYTES + clients * per_client,
                    clients * _SYNTHETIC_CLIENT_HOST_BYTES, "its data")
    if spec.dataset == "fedem-synthetic":
        rows = fedem.row_count(clients, spec.seed, spec.test_fraction)
        return Need(rows * (fedem.DIMENSION * 4 + 12) + clients * per_client,
                    rows * 56 + clients * per_client, "its data")
    if spec.dataset in _SOURCE_SHAPES:
        rows, features = _SOURCE_SHAPES[spec.dataset]
        return Need(rows * (features * 4 + 12) + clients * per_client,
                    rows * features * 8 + clients * per_client, "its data")
    if spec.dataset == "leaf" and spec.data_dir is not None:
        files = sum(p.stat().st_size for p in Path(spec.data_dir).rglob("*.json")
                    if p.is_file())
        # JSON text of floats is ~2x its float32 arrays (not so for Shakespeare's text, whose
        # 1-byte characters become 4-byte indices: an estimate 8x low, for a dataset of MBs);
        # parsed, Python lists take ~4x the text
        return Need(files // 2, files * 4, "its data files")
    return None


def _synthetic_rows(clients: int, seed: int) -> int:
    """Rows Synthetic(alpha, beta) makes for `clients` (its sizes, drawn as it draws them)."""
    if clients <= 20_000_000:
        sizes = np.random.default_rng(seed).lognormal(4.0, 2.0, clients).astype(np.int64)
        return int(sizes.sum()) + 50 * clients
    return int(clients * (math.exp(4.0 + 2.0**2 / 2) + 50))  # the mean size, e^(mu+s^2/2)+50


def gib(count: float) -> str:
    """Bytes in GiB, or MiB below one GiB."""
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


class DataFit(NamedTuple):
    """What building a config's dataset takes here, beside what this machine has
    (`data_fit`): host memory holds the generator's temporaries, and on the CPU backend the
    rows too; device memory the rows (0 on the CPU backend)."""

    need: Need
    host: int
    device: int
    host_available: int
    device_available: int
    problem: Optional[str]  # the refusal in one line (what to change); None when it fits

    @property
    def fits(self) -> bool:
        return self.problem is None


def data_fit(spec) -> Optional[DataFit]:
    """The dataset of `spec` (a `mcfl.data.DataSpec`) against this machine's memory, from its
    settings alone (nothing is built); None where its size cannot be told before it is read
    (`data_bytes`)."""
    need = data_bytes(spec)
    if need is None:
        return None
    host = need.host + (need.device if on_host() else 0)
    device = 0 if on_host() else need.device
    host_free, device_free = host_available(), device_available()
    problem = None
    for needed, available, where in ((host, host_free, "host memory"),
                                     (device, device_free, "device memory")):
        if needed > available:
            clients = spec.clients or 0
            fits = int(clients * available / needed) if clients else 0
            advice = (f"use at most about {fits:,} --clients" if fits else "use fewer --clients")
            if spec.dataset not in ("synthetic", "fedem-synthetic", "leaf"):
                advice += " or --samples-per-client"
            elif spec.dataset == "fedem-synthetic" and spec.test_fraction is None:
                advice += " or a --test-fraction (instead of 5000 test rows a client)"
            problem = (f"{spec.dataset} with {clients:,} clients needs about "
                       f"{gib(needed)} of {where} for {need.what}; "
                       f"{gib(available)} is available: {advice} (or set "
                       f"{LIMIT_VARIABLE} if the figure is wrong)")
            break
    return DataFit(need, host, device, host_free, device_free, problem)


def check_data_fits(spec) -> None:
    """Refuse a dataset (its `mcfl.data.DataSpec`) that cannot be built in this machine's
    memory."""
    fit = data_fit(spec)
    if fit is not None and not fit.fits:
        raise McflError(fit.problem)


def resident_bytes(*trees) -> int:
    """Bytes the arrays of `trees` take (a run's data, its state)."""
    return sum(int(x.nbytes) for tree in trees for x in jax.tree.leaves(tree)
               if hasattr(x, "nbytes"))


def check_program_fits(extra_bytes: Optional[int], what: str, run: str,
                       devices: Optional[int] = None, resident: int = 0) -> None:
    """Refuse a compiled program that allocates `extra_bytes` (beyond its live arguments, which
    take `resident`; XLA's figure, None where the backend gives none) when the device has
    less free; `run` names the run in the message ("fedavg on 1,000 clients") and `devices`
    is the count it asked for (None: all)."""
    if extra_bytes is None:
        return
    available = device_available(resident)
    if extra_bytes > available:
        # (more devices only where the run leaves some unused: by default it takes them all)
        spare = devices is not None and devices < len(jax.devices())
        raise McflError(f"{run} needs about "
                        f"{gib(extra_bytes)} more memory for {what}; {gib(available)} is "
                        "available: use fewer --clients or --clients-per-round"
                        + (", a smaller model, or more devices (--devices up to "
                           f"{len(jax.devices())})" if spare else " or a smaller model"))


# What a run keeps per round on the host whatever its size (its row of metrics as a Python
# dict of about 20 numbers, its seconds, its epsilon, its chunk): at most about 2 KB (a dict
# of 20 floats is 0.94 KB by sys.getsizeof of the dict and its values; rows with cluster
# sizes and the unseen clients' scores hold more).
ROUND_BOOKKEEPING_BYTES = 2_000


def check_rounds_fit(rounds: int, checkpoint_every: Optional[int] = None) -> None:
    """Refuse a round count whose bookkeeping (a row a round, `ROUND_BOOKKEEPING_BYTES`) would
    take more than half the host's available memory, before anything is built."""
    needed = rounds * ROUND_BOOKKEEPING_BYTES
    available = host_available()
    if needed > available // 2:
        most = max(1, available // 2 // ROUND_BOOKKEEPING_BYTES)
        raise ConfigError(f"--rounds {rounds:,} would keep about {gib(needed)} of rows in "
                          f"memory (a row of metrics a round); {gib(available)} is available: "
                          f"allowed: at most about {most:,} rounds here")


def out_of_memory(error: BaseException) -> Optional[McflError]:
    """One line for an out-of-memory error that was not foreseen (numpy's MemoryError, XLA's
    RESOURCE_EXHAUSTED), None for any other error."""
    text = str(error)
    if isinstance(error, MemoryError) or "RESOURCE_EXHAUSTED" in text:
        first = next((line for line in text.splitlines() if line.strip()),
                     type(error).__name__)
        return McflError(f"out of memory ({first.strip()[:160]}); use fewer --clients, "
                         "--clients-per-round or --samples-per-client, or a smaller model")
    return None
