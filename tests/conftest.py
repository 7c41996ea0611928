"""Shared fixtures: tiny federated datasets built once per session.

The suite runs with XLA's optimisation passes off (JAX_DISABLE_MOST_OPTIMIZATIONS=1, set here
before JAX starts and inherited by the tests' subprocesses): the tests check what programs
compute, on tiny inputs, and most of their time was compiling (20% less with the passes off,
a third less again with XLA:CPU's fusion emitters off, below); the benchmarks and the demo
run fully optimised programs. For the same reason the session keeps JAX's persistent
compilation cache (in a temporary folder): tests that build the same small programs compile
them once.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# XLA:CPU's fusion emitters take longer to compile than its older elemental emitters: with them
# off the programs compute the same and the whole suite took 36% less time (12 min 12 s against
# 7 min 50 s here, 2026-11-26). Subprocesses append their own flags to these.
# And XLA:CPU splits each program's code into parts it generates in parallel: with a worker per
# core there is no core to spare, and one part compiled a set of mcfl's programs 11% faster
# (5.59 s against 6.32 s, three runs each, alternating, 2-core EPYC, 2026-12-08).
os.environ["XLA_FLAGS"] = " ".join(dict.fromkeys(
    [*os.environ.get("XLA_FLAGS", "").split(), "--xla_cpu_use_fusion_emitters=false",
     "--xla_cpu_parallel_codegen_split_count=1"]))

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mcfl.apps.libtpu_environment import quiet_libtpu_without_tpu
from mcfl.data.federated import from_splits
from mcfl.runtime import compile_cache

# With the TPU compiler installed (the test extra) and no TPU chips here, libtpu's placeholder
# environment keeps its start-up lines off the output and lets the workers (and their
# subprocesses, which inherit it) compile at once. The `mcfl` program names it itself;
# `import mcfl` does not (mcfl.apps.libtpu_environment), so the session names it here, before
# any JAX backend starts.
quiet_libtpu_without_tpu()

# The CLI caches prepared datasets by default: keep the tests' cache out of the home folder.
# One cache for the whole session: made by the first process (pytest's controller, before it
# starts the xdist workers, which inherit it), so the workers share compiled programs.
os.environ.setdefault("MCFL_TEST_SESSION_CACHE", tempfile.mkdtemp(prefix="mcfl-test-cache-"))
os.environ["MCFL_CACHE_DIR"] = os.environ["MCFL_TEST_SESSION_CACHE"]
# The in-process commands would turn the same cache on at their first run
# (mcfl.runtime.compile_cache); on from the start, every test shares it. Subprocesses choose
# for themselves.
compile_cache.enable(Path(os.environ["MCFL_CACHE_DIR"]) / compile_cache.SUBDIRECTORY)

HERE = Path(__file__).parent
# Checks that need a process of their own (several devices) and take minutes of compiling run
# in the background from the start of the session, while the other tests run; their file runs
# last, to collect the results.
BACKGROUND_FILE = "test_devices.py"
WORKER_NICENESS = 5  # added to the workers' nice value once the background run has started


def xla_flags_with_devices(count: int) -> str:
    """This session's XLA_FLAGS with `count` forced CPU devices, for a subprocess: appended,
    so the session's own flags (above) stay."""
    return f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count={count}"


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.nodeid.split("::")[0].endswith(BACKGROUND_FILE))


def pytest_collection_finish(session):
    """What the background run must do for the tests selected (after -m and -k): whether it
    is needed, and the algorithms it runs over 4 devices (the default run's representative
    few, or with -m slow the rest)."""
    chosen = [item for item in session.items if BACKGROUND_FILE in item.nodeid]
    session.config.background_needed = bool(chosen)
    session.config.background_algorithms = sorted({
        item.callspec.params["name"] for item in chosen
        if hasattr(item, "callspec") and "name" in item.callspec.params})


def shared_folder(tmp_path_factory) -> Path:
    """A folder every pytest-xdist worker of this session sees (the background run's results,
    the conformance runs' one-device results)."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "background"
    shared.mkdir(exist_ok=True)
    return shared


@pytest.fixture(scope="session")
def shared(tmp_path_factory) -> Path:
    return shared_folder(tmp_path_factory)


@pytest.fixture(scope="session", autouse=True)
def conformance_background(request, tmp_path_factory):
    """The results of tests/conformance_background.py (a function giving a dict), started
    with the session when the session has tests that need it: once per test run, also when
    the tests run in several pytest-xdist workers (the first worker to claim it starts it;
    every worker reads its results file)."""
    if not getattr(request.config, "background_needed", False):
        yield None
        return
    shared = shared_folder(tmp_path_factory)
    results_file, error_file = shared / "results.json", shared / "error.txt"
    proc = None
    try:
        os.close(os.open(shared / "claimed", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        pass  # another worker started it
    else:
        env = {**os.environ, "XLA_FLAGS": xla_flags_with_devices(4),
               "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}
        proc = subprocess.Popen([sys.executable, str(HERE / "conformance_background.py"),
                                 str(results_file), str(error_file),
                                 ",".join(request.config.background_algorithms)], env=env)
    # The background run is the session's longest task, which test_devices.py waits for at the
    # end: the workers give it the first claim on the cores (they lower their own priority
    # once it has started with theirs), so the cores are not left half idle at the end.
    os.nice(WORKER_NICENESS)
    results: dict = {}

    def get_results() -> dict:
        deadline = time.monotonic() + 1500
        while not results:
            if error_file.exists():
                pytest.fail(error_file.read_text()[-3000:])
            if results_file.exists():
                results.update(json.loads(results_file.read_text()))
            elif time.monotonic() > deadline:
                pytest.fail("tests/conformance_background.py gave no results in 1500 s")
            else:
                time.sleep(0.5)
        return results

    yield get_results
    if proc is not None:
        # Other workers may still be waiting for its results: this worker ran out of tests
        # first (a -k selection gave it none of test_devices'), so it waits rather than kill.
        try:
            if request.session.shouldstop or request.session.shouldfail:
                raise subprocess.TimeoutExpired(proc.args, 0)  # (an interrupted session)
            proc.wait(timeout=1500)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(autouse=True)
def _own_trace_counts():
    """chex counts traces by a function's source: the bound rounds of `Bound` share theirs, so
    each test starts from zero."""
    import chex

    chex.clear_trace_counter()


@pytest.fixture
def wrap_algorithm(monkeypatch):
    """``wrap_algorithm(wrap)``: every algorithm a run builds in this test is ``wrap(built)``
    (`mcfl.runs.plan.Plan.build_algorithm` replaced), and the programs kept from earlier runs
    are forgotten before and after, so that the wrapped algorithm is the one compiled."""
    from mcfl.runs import plan, program

    def install(wrap):
        build = plan.Plan.build_algorithm
        monkeypatch.setattr(plan.Plan, "build_algorithm",
                            lambda self, *a, **k: wrap(build(self, *a, **k)))
        program.forget_programs()

    yield install
    monkeypatch.undo()
    program.forget_programs()


def ragged_dataset(sizes, num_features=5, num_classes=3, seed=0, name="ragged"):
    """A dataset whose client i has exactly sizes[i] training rows and 2 test rows."""
    rng = np.random.default_rng(seed)
    sizes = np.asarray(sizes)
    owner = np.repeat(np.arange(len(sizes)), sizes)
    x = rng.normal(size=(owner.size, num_features)).astype(np.float32)
    y = rng.integers(0, num_classes, owner.size)
    test_owner = np.repeat(np.arange(len(sizes)), 2)
    xt = rng.normal(size=(test_owner.size, num_features)).astype(np.float32)
    yt = rng.integers(0, num_classes, test_owner.size)
    return from_splits(name, (x, y, owner), (xt, yt, test_owner), len(sizes), num_classes)


@pytest.fixture(scope="session")
def ragged():
    """Six clients with very different sizes (3 to 300 training rows)."""
    return ragged_dataset([3, 300, 17, 40, 9, 64])


def planted_gaussian(num_clients: int, num_clusters: int = 4, kind: str = "permuted",
                     labels: str = ""):
    """Gaussian data of 10 classes in 12 dimensions over `num_clients` clients IID (or by the
    label partition `labels`, e.g. "shards:3"), each client carrying one of `num_clusters`
    planted label permutations (its true cluster)."""
    from mcfl.data import partition_arrays
    from mcfl.data.arrays import LabelledArrays
    from mcfl.data.spec import parse_partition

    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, 6000)
    means = rng.normal(0, 3, (10, 12))
    x = (means[y] + rng.normal(0, 1, (6000, 12))).astype(np.float32)
    arrays = LabelledArrays("gauss", x, y, 10, np.ones(6000, bool))
    spec = f"{kind}:{num_clusters}" + (f"+{labels}" if labels else "")
    return partition_arrays(arrays, parse_partition(spec), num_clients, 0.2, "none", seed=1)


class Bound:
    """A built algorithm with its hyperparameters fixed, run on the device as a run's program
    runs it (`mcfl.algorithms.framework.device.on_device`): ``init(data, key)`` and ``round(state,
    data, key, round_=1)`` (`round_`: the round's number, which only a client schedule reads). Its
    states are the algorithm's own for an algorithm without per-client rows, else the
    `DeviceState` (rows in `.rows`, the algorithm's state in `.algorithm`).
    ``client_models(state)`` gives every client's models as ``(models [M, ...], index [C] or
    None)``, made from the rows for an algorithm that keeps them."""

    def __init__(self, algorithm, hp, block_size=None, transform=None):
        from mcfl.algorithms.framework.device import DeviceState, on_device
        from mcfl.transforms import IDENTITY

        self.algorithm, self.hp, self.block_size = algorithm, hp, block_size
        transform = IDENTITY if transform is None else transform
        self.transform = transform
        self.device = device = on_device(algorithm, transform)
        self.participants = algorithm.participants
        self.client_state = algorithm.client_state
        self.rows = algorithm.rows

        def wrap(state):
            if self.rows or transform.acts:
                return state
            return DeviceState(state, None, None)

        def unwrap(state):
            return state if (self.rows or transform.acts) else state.algorithm

        def init(data, key):
            return unwrap(device.init(data, key, hp))

        def round(state, data, key, round_=1):
            state, metrics = device.round(wrap(state), data, key, hp, round_)
            return unwrap(state), metrics

        self.init, self.round = init, round
        self._wrap = wrap
        self.assignments = None  # as the algorithm's: None, or each client's cluster
        if algorithm.assignments is not None:
            self.assignments = lambda state: algorithm.assignments(self.algorithm_state(state))

    def device_state(self, state):
        """`state` as the run holds it (`DeviceState`)."""
        return self._wrap(state)

    def algorithm_state(self, state):
        return self._wrap(state).algorithm

    def client_models(self, state, data=None):
        """(models [M, ...], index [C] or None) every client is evaluated with."""
        from mcfl.algorithms.framework.base import PerClientModels
        from mcfl.algorithms.framework.stored import fresh_like, to_training

        state = self.device_state(state)
        if self.rows:
            rows = to_training(state.rows, fresh_like(self.client_state, state.algorithm))
            count = jax.tree.leaves(rows)[0].shape[0]
            clients = jnp.arange(count, dtype=jnp.int32)
            return self.client_state.models(state.algorithm, rows, clients), clients
        described = self.algorithm.client_models(state.algorithm, data)
        if isinstance(described, PerClientModels):  # (Per-FedAvg: w, each made from it)
            return described.made_from, None
        return described.models, described.index

    def described(self, state, data=None):
        """The algorithm's `ClientModels` of `state`."""
        return self.algorithm.client_models(self.algorithm_state(state), data)


def wrapped(bound: Bound, wrapper, *args, shift_prob=None) -> Bound:
    """`bound` with its algorithm wrapped (`mcfl.algorithms.wrappers.shift.with_shift`,
    `mcfl.algorithms.wrappers.schedule.with_schedule` and their `args`); `shift_prob` sets
    ``hp.shift_prob``."""
    hp = bound.hp if shift_prob is None else bound.hp.replace(shift_prob=shift_prob)
    return Bound(wrapper(bound.algorithm, *args), hp, bound.block_size, bound.transform)


def algorithm(name, model, training, clients_per_round, block_size, clusters=1, **params):
    """The registered algorithm `name` built for these settings, bound to `training` and its
    hyperparameters `params` (field names or flat keys; the others at their defaults)."""
    from mcfl.algorithms import AlgorithmContext, Hyperparams, get

    spec = get(name)
    built = spec.build(AlgorithmContext(model, clients_per_round, clusters,
                                        block_size=block_size))
    return Bound(built, Hyperparams(training, spec.params_with(**params)), block_size)
