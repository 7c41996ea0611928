"""The round program of a run whose clients' rows live in a host or disk store, and the choice
between it and the device's (`run_program`).

`StoredProgram` answers what `mcfl.runs.loop` and the runner ask of a `RoundProgram` (init, rounds,
evaluate, compile, checkpoint), with the algorithm's state on the device and its clients' rows
(`mcfl.algorithms.base.ClientState`) in the store. A round:

1. the round's clients come from its key (`FederatedAlgorithm.participants`, given the state
   as `init` left it: participants depend on nothing a round changes), before the round runs;
2. their rows are gathered from the store (fetched already: see below), the never-trained
   ones made fresh on the device;
3. the round runs on the device (the algorithm's round, with the rows in its `Exchange`, as
   the device store runs it);
4. the trained rows are written back by a writer thread while the next round computes.

Round r + 1's clients are known from its key, so their rows are read by a reader thread while
round r computes (rows round r is training are taken from its result instead of the store).
Evaluation reads the store in chunks of clients (`stored.evaluation_chunk`), as the device
store evaluates its rows. Rounds run one at a time: `scan_rounds` needs the rows on the
device.

An algorithm whose *initialisation* trains every client once and clusters the models (FeSEM,
Robust: `PopulationStart`) streams the clients' models through the store instead, in chunks,
and clusters them with the streamed k-means (`mcfl.clustering.streamed`); its rounds then run
on the device as usual.
"""

from __future__ import annotations

import concurrent.futures
import functools
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from mcfl.algorithms.device import DeviceState, exchange_for
from mcfl.algorithms.stored import (
    evaluate_rows,
    evaluated_floats,
    evaluation_chunk,
    to_storage,
    to_training,
    with_fresh,
)
from mcfl.engine import EvalCounts
from mcfl.errors import ConfigError
from mcfl.runs.execution import RunPlan
from mcfl.runs.plan import Plan
from mcfl.runs.program import RoundProgram, over_members, round_program
from mcfl.runtime import distributed
from mcfl.store import FOLDER
from mcfl.store.choose import StoreChoice, choose_store
from mcfl.store.layout import RowLayout
from mcfl.store.start import streamed_start
from mcfl.store.stores import make_store
from mcfl.transforms import initial_state


class StoredProgram(RoundProgram):
    """`RoundProgram` with the client rows in a `kind` ("host" or "disk") store in `folder`
    (None: host memory only, or for disk a temporary folder the caller provides)."""

    def __init__(self, plan: Plan, run_plan: RunPlan, kind: str, folder: Optional[Path],
                 traced=(), members: bool = False, mesh=None, width=None, jit_options=None):
        if plan.participation.sampling == "poisson":
            raise ConfigError(f"--client-sampling poisson runs with the clients' rows on the "
                              f"device; this run keeps them in a {kind} store: give "
                              f"--client-store device, or fewer clients")
        if plan.participation.system is not None:
            raise ConfigError(f"clients as they are (--device-speeds, --client-dropout, ...) "
                              f"run with the clients' rows on the device; this run keeps them "
                              f"in a {kind} store: give --client-store device, or fewer "
                              f"clients")
        super().__init__(plan, run_plan._replace(scan_rounds=False), traced, members, mesh,
                         width, jit_options)
        self.kind, self.folder = kind, folder
        self.temporary = False  # the folder is the program's own, removed when it closes
        algorithm, transform = self.algorithm, self.transform
        self.rows_kept = algorithm.rows  # else: a streamed start
        self.store = None
        self.initial = None  # the shared state right after init (fresh rows come from it)
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="mcfl-store")
        self._writing: Optional[concurrent.futures.Future] = None
        self._fetched = None  # (round, clients [M, S], future of the gather)
        self._last = None  # (clients [M, S], packed rows [M, S, B]) of the last round
        if not self.rows_kept:
            return
        client_state = algorithm.client_state
        dtype = client_state.dtype
        jit_options = jit_options or {}
        lift = (functools.partial(over_members, mesh=mesh, width=width) if members
                else lambda fn, batched: fn)

        model = self.run_plan.model

        def hp(values):
            return self.hyperparams(values)

        def init(values, init_key, data):
            params = hp(values)
            return DeviceState(algorithm.init(data, init_key, params), None,
                               initial_state(transform, params.privacy))

        def sample(initial, rounds_key, data, r):
            return algorithm.participants(initial, data, jax.random.fold_in(rounds_key, r), r)

        # Rows travel as bytes ([S, row_bytes] uint8, `RowLayout`), unpacked and packed inside
        # the programs: the host only reads and writes them.
        def round_(values, state, packed, written, clients, data, rounds_key, r, initial):
            stored = self.layout.unpack_device(packed)
            rows = with_fresh(client_state, initial, stored, written, clients)
            like = client_state.fresh(initial, clients[:1])
            key = jax.random.fold_in(rounds_key, r)
            exchange = exchange_for(transform, clients, to_training(rows, like),
                                    state.transform, key)
            shared, metrics, exchange = algorithm.round(state.algorithm, data, key, hp(values),
                                                        exchange)
            new = to_storage(exchange.rows, dtype)
            return (DeviceState(shared, None, exchange.transform_state),
                    self.layout.pack_device(new), jax.tree.map(lambda m: m[None], metrics))

        def evaluate_chunk(state, packed, written, clients, data, initial):
            described = algorithm.client_models(state.algorithm, data)
            apply_fn = described.apply or model.apply
            data = data if described.data is None else described.data
            return evaluate_rows(client_state, apply_fn, run_plan.eval_block, state.algorithm,
                                 initial, self.layout.unpack_device(packed), written, clients,
                                 data)

        def assignments(state):
            return algorithm.assignments(state.algorithm)

        def test_counts(state, data):
            """The clients' test rows as they hold them now (a shift moves them)."""
            described = algorithm.client_models(state.algorithm, data)
            return (data if described.data is None else described.data).test_counts

        self._init = jax.jit(lift(init, (True, True, False)), **jit_options)
        self._sample = jax.jit(lift(sample, (True, True, False, False)), **jit_options)
        self._round = jax.jit(lift(round_, (True, True, True, True, True, False, True, False,
                                            True)), **jit_options)
        self._evaluate_chunk = jax.jit(lift(evaluate_chunk, (True, True, True, False, False,
                                                             True)), **jit_options)
        self._assignments = (jax.jit(lift(assignments, (True,)), **jit_options)
                             if self.clustered else None)
        self._test_counts = jax.jit(lift(test_counts, (True, False)), **jit_options)


    # ---- the member axis: the store always has one, a single run's arrays get it here
    def _with_members(self, x):
        return x if self.members else jax.tree.map(lambda a: np.asarray(a)[None], x)

    def _without_members(self, x):
        return x if self.members else jax.tree.map(lambda a: a[0], x)

    # ---- compile
    def compile_init(self, values, init_keys, data) -> None:
        self._lower_and_compile(self.init_programs(values, init_keys, data))

    def compile_rounds(self, values, state, rounds_keys, data) -> Optional[int]:
        if not self.rows_kept:
            return super().compile_rounds(values, state, rounds_keys, data)
        self._lower_and_compile(self.round_programs(values, state, rounds_keys, data))
        return None

    def init_programs(self, values, init_keys, data) -> dict:
        # (a streamed start's programs are compiled as it streams: `streamed_start`)
        return super().init_programs(values, init_keys, data) if self.rows_kept else {}

    def round_programs(self, values, state, rounds_keys, data) -> dict:
        """The round and the evaluation of the rows in the store: drawing the round's clients
        (`sample`), the round on their gathered rows, the evaluation of a chunk of clients,
        and what evaluation asks of the state (assignments, test counts)."""
        if not self.rows_kept:
            return super().round_programs(values, state, rounds_keys, data)
        self.num_clients = int(data.num_clients)
        initial = self.initial if self.initial is not None else state.algorithm
        self.layout = self._layout(initial)
        self.evaluated_floats = self._evaluated_floats(initial)
        first = jnp.asarray(1, jnp.int32)
        clients = jax.eval_shape(self._sample, initial, rounds_keys, data, first)
        stored = self._packed_like(clients.shape)
        written = jax.ShapeDtypeStruct(clients.shape, jnp.bool_)
        chunk = self._eval_chunk()
        chunk_clients = jax.ShapeDtypeStruct((chunk,), jnp.int32)
        member = clients.shape[:-1]
        programs = {
            "sample": (self._sample, (initial, rounds_keys, data, first)),
            "round": (self._round, (values, state, stored, written, clients, data,
                                    rounds_keys, first, initial)),
            "evaluate": (self._evaluate_chunk, (state, self._packed_like(member + (chunk,)),
                                                jax.ShapeDtypeStruct(member + (chunk,),
                                                                     jnp.bool_),
                                                chunk_clients, data, initial)),
        }
        if self._assignments is not None:
            programs["assignments"] = (self._assignments, (state,))
        programs["test_counts"] = (self._test_counts, (state, data))
        return programs

    def _packed_like(self, shape):
        """Abstract packed rows [*shape, row_bytes]."""
        return jax.ShapeDtypeStruct(tuple(shape) + (self.layout.row_bytes,), jnp.uint8)

    def _layout(self, initial) -> RowLayout:
        """The layout of one client's stored row, for an algorithm state like `initial`."""
        client_state = self.algorithm.client_state
        one = (jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), initial)
               if self.members else initial)
        row = jax.eval_shape(lambda s: to_storage(client_state.fresh(
            s, jnp.zeros((1,), jnp.int32)), client_state.dtype), one)
        return RowLayout.of(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                                         row))

    def _evaluated_floats(self, initial) -> int:
        one = (jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), initial)
               if self.members else initial)
        return evaluated_floats(self.algorithm.client_state, one)

    def _eval_chunk(self) -> int:
        return evaluation_chunk(self.num_clients, self.evaluated_floats)

    # ---- init
    def init(self, values, init_keys, data):
        self.num_clients = int(data.num_clients)
        members = int(np.shape(jax.random.key_data(init_keys))[0]) if self.members else 1
        if not self.rows_kept:
            self.store = None
            return streamed_start(self, values, init_keys, data, members)
        state = jax.block_until_ready(self._compiled["init"][1](values, init_keys, data))
        self.initial = state.algorithm
        self.layout = self._layout(self.initial)
        self.evaluated_floats = self._evaluated_floats(self.initial)
        self.close()
        self.store = make_store(self.kind, members, self.num_clients, self.layout.row_bytes,
                                self.folder)
        return state

    @property
    def start_streamed(self) -> bool:
        """Whether `init` is a population start through the store (FeSEM, Robust)."""
        return not self.rows_kept

    def initial_state(self, values, init_keys, data, resuming: bool = False):
        """A run resumed from a checkpoint does not train every client again for a start it
        restores: only the state's shapes, dtypes and placement are made."""
        if not (resuming and self.start_streamed):
            return self.init(values, init_keys, data)
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                            jax.eval_shape(self._init, values, init_keys, data))

    # ---- rounds
    def rounds(self, count: int, values, state, data, rounds_keys, first: int):
        if not self.rows_kept:
            return super().rounds(count, values, state, data, rounds_keys, first)
        assert count == 1, "a host or disk store runs round by round"
        clients, packed, written = self._gather_round(first, rounds_keys, data)
        # (the next round's clients are drawn before this round is queued on the device,
        # which would run it first)
        upcoming = (self._round_clients(first + 1, rounds_keys, data)
                    if first < self.run_plan.rounds else None)
        args = (values, state, jax.device_put(self._without_members(packed)),
                self._without_members(written), self._without_members(clients), data,
                rounds_keys, jnp.asarray(first, jnp.int32), self.initial)
        state, new_rows, metrics = self._compiled["round"][1](*args)
        self.wait_writes()  # the previous round's rows are in the store
        if upcoming is not None:  # fetch the next round's rows while this one runs
            skip = _members_in(upcoming, clients)
            self._fetched = (first + 1, upcoming,
                             self._pool.submit(self.store.gather, upcoming, skip))
        new_packed = self._with_members(np.asarray(jax.device_get(new_rows)))
        self._last = (clients, new_packed)
        self._writing = self._pool.submit(self.store.scatter, clients, new_packed, first)
        return state, jax.device_get(metrics)

    def _round_clients(self, r: int, rounds_keys, data) -> np.ndarray:
        clients = self._compiled["sample"][1](self.initial, rounds_keys, data,
                                              jnp.asarray(r, jnp.int32))
        return self._with_members(np.asarray(jax.device_get(clients), np.int64))

    def _gather_round(self, r: int, rounds_keys, data):
        """([M, S] clients, [M, S, B] rows, [M, S] written) of round `r`: the fetched rows, or
        read now; rows the last round trained come from its result."""
        if self._fetched is not None and self._fetched[0] == r:
            _, clients, future = self._fetched
            packed, written = future.result()
        else:
            clients = self._round_clients(r, rounds_keys, data)
            self.wait_writes()
            packed, written = self.store.gather(clients)
        self._fetched = None
        if self._last is not None:
            last_clients, last_packed = self._last
            for m in range(clients.shape[0]):
                where = {int(c): j for j, c in enumerate(last_clients[m])}
                for j, c in enumerate(clients[m].tolist()):
                    if c in where:
                        packed[m, j] = last_packed[m, where[c]]
                        written[m, j] = True
        return clients, packed, written

    def wait_writes(self) -> None:
        """Wait for the rows being written (a failed write raises here)."""
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    # ---- evaluation
    def evaluate(self, values, state, data):
        if not self.rows_kept:
            return super().evaluate(values, state, data)
        self.wait_writes()
        chunk, c = self._eval_chunk(), self.num_clients
        parts = []
        reading = self._pool.submit(self._read_chunk, 0, chunk)
        for lo in range(0, c, chunk):
            packed, written = reading.result()
            if lo + chunk < c:  # read the next chunk while this one is evaluated
                reading = self._pool.submit(self._read_chunk, lo + chunk, chunk)
            clients = jnp.minimum(lo + jnp.arange(chunk, dtype=jnp.int32), c - 1)
            counts = self._compiled["evaluate"][1](
                state, jax.device_put(self._without_members(packed)),
                self._without_members(written), clients,
                data, self.initial)
            parts.append(jax.device_get(counts))
        axis = 1 if self.members else 0
        counts = jax.tree.map(lambda *p: np.concatenate(p, axis=axis).take(
            np.arange(c), axis=axis), *parts)
        assigned = (self._compiled["assignments"][1](state) if self._assignments is not None
                    else None)
        test_counts = np.asarray(jax.device_get(self._compiled["test_counts"][1](state, data)))
        return EvalCounts(*counts), test_counts, jax.device_get(assigned)

    def _read_chunk(self, lo: int, chunk: int):
        """[M, chunk, B] rows and [M, chunk] written of clients lo, lo + 1, ... (past the last
        client: the last client again, as the device store pads)."""
        hi = min(lo + chunk, self.num_clients)
        rows, written = zip(*(self.store.chunk(m, lo, hi) for m in range(self.store.members)))
        # (one member's rows as read: aligned, so the device takes them without a copy)
        rows = rows[0][None] if len(rows) == 1 else np.stack(rows)
        written = np.stack(written)
        if hi - lo < chunk:
            pad = chunk - (hi - lo)
            rows = np.concatenate([rows, np.repeat(rows[:, -1:], pad, axis=1)], axis=1)
            written = np.concatenate([written, np.repeat(written[:, -1:], pad, axis=1)], axis=1)
        return rows, written

    # ---- checkpoints
    def checkpoint_state(self, round_: int, state):
        """What a checkpoint of round `round_` saves: the state and the store's manifest."""
        if self.store is None:
            return state
        self.wait_writes()
        self._manifest = self.store.manifest(round_)
        return {"state": state, "store": self._manifest}

    def checkpointed(self) -> None:
        if self.store is not None:
            self.store.checkpointed(self._manifest)

    def checkpoint_template(self, state):
        if self.store is None:
            return state
        return {"state": state, "store": np.zeros((self.store.members, self.num_clients),
                                                  np.int32)}

    def restored(self, saved):
        if self.store is None:
            return saved
        self.store.restore(np.asarray(saved["store"]))
        self._fetched = self._last = None
        return saved["state"]

    def move_to(self, folder: Path) -> None:
        """The run folder moved (a replaced run swapped in): the store is now in `folder`."""
        self.wait_writes()
        self.folder = folder
        if self.store is not None:
            self.store.move_to(folder)

    def close(self) -> None:
        """Wait for the writes in flight; a temporary folder is removed, a run folder's
        store stays (its checkpoints name its rows)."""
        try:
            if self.store is not None:
                self.wait_writes()
                self.store.close()
        finally:
            if self.temporary and self.folder is not None:  # (made even when nothing was kept)
                shutil.rmtree(self.folder, ignore_errors=True)


def _members_in(upcoming: np.ndarray, current: np.ndarray) -> np.ndarray:
    """[M, S] whether each upcoming client is one of its member's current clients."""
    return np.stack([np.isin(u, c) for u, c in zip(upcoming, current)])


def announce(choice: StoreChoice) -> None:
    """Say on stderr which store a run uses and why, unless it is the device."""
    if choice.kind != "device":
        print(f"mcfl: client store: {choice.kind} ({choice.reason})", file=sys.stderr)


def run_program(plan: Plan, run_plan: RunPlan, data, run_dir: Optional[Path],
                jit_options: Optional[dict] = None, members: bool = False, traced=(),
                member_count: int = 1, mesh=None, width=None,
                accelerator_free: Optional[int] = None) -> tuple[RoundProgram, StoreChoice]:
    """The program of `plan` with the client store it asks for (a disk store in
    ``run_dir/client_store``, or without a run folder a temporary folder the program removes
    when closed), and the store chosen. `accelerator_free`: the memory of an accelerator the
    run is planned for (`choose_store`)."""
    device = round_program(plan, run_plan, data, traced, members, mesh, width, jit_options)
    choice = choose_store(plan.execution.client_store, device.algorithm, plan.algorithm.name,
                          plan.hyperparams(run_plan.model), data, member_count,
                          accelerator_free)
    if choice.kind == "device":
        return device, choice
    if distributed.process_count() > 1:
        raise ConfigError(f"client_store={choice.kind!r} ({choice.reason}) runs in one "
                          f"process; a multi-process run keeps client state on the devices")
    temporary = run_dir is None and choice.kind == "disk"
    folder = (Path(tempfile.mkdtemp(prefix="mcfl-store-")) if temporary
              else None if run_dir is None else Path(run_dir) / FOLDER)
    if run_plan.scan_rounds:
        choice = choice._replace(reason=f"{choice.reason}; its rounds run one at a time "
                                 f"(scan_rounds needs the client state on the device)")
    program = StoredProgram(plan, run_plan, choice.kind, folder, traced, members, mesh, width,
                            jit_options)
    program.temporary = temporary
    return program, choice
