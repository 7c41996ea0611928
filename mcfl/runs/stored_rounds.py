"""The round program's rounds when its clients' rows live in a host or disk store.

`mcfl.runs.program.RoundProgram` runs every store; with the rows on the device its round
gathers and scatters them inside the jitted round. With a host or disk store
(`mcfl.store.stores`) the same round (`mcfl.algorithms.framework.device.train_rows`) runs on rows
handed in, and `StoredRounds` moves them (`mcfl.store.rows.StoredRows`: gather, prefetch, scatter):

1. the round's participants come from its key and the state (`FederatedAlgorithm.participants`,
   with the Poisson sample's or the clock's ``present`` mask);
2. their rows are gathered from the store (fetched already: see below), the never-trained
   ones made fresh on the device from the state `init` left;
3. the round runs on the device on those rows, which come back as the round leaves them
   (trained, or as they were for the slots that did not report);
4. the rows are written back by a writer thread while the next round computes.

Round r + 1's participants are drawn while round r computes, so their rows are read by a
reader thread meanwhile; when the participants depend on the clock the round moves
(`SystemModel.samples_itself`), they are drawn from round r's state, once it is computed.
Evaluation reads the store in chunks of clients (`stored.evaluation_chunk`), as the device
store evaluates its rows. Rounds run one at a time: `scan_rounds` needs the rows on the device.

An algorithm whose *initialisation* trains every client once and clusters the models (FeSEM,
Robust: `PopulationStart`) streams the clients' models through the store instead, in chunks,
and clusters them with the streamed k-means (`mcfl.clustering.streamed`); its rounds then run
on the device as usual (`RoundProgram` with the rows on the device).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from mcfl.algorithms import FederatedAlgorithm
from mcfl.algorithms.framework.device import DeviceState, round_participants, train_rows
from mcfl.algorithms.framework.stored import (
    evaluate_rows,
    evaluated_floats,
    evaluation_chunk,
    to_storage,
    with_fresh,
)
from mcfl.engine import EvalCounts
from mcfl.store.layout import RowLayout
from mcfl.store.rows import StoredRows
from mcfl.store.stores import make_store
from mcfl.transforms import MessageTransform


class StorePlace(NamedTuple):
    """Where a program's client rows live: `kind` (device | host | disk), the folder of a disk
    or checkpointed host store (None: host memory only), and whether that folder is the
    program's own, removed when it closes (a disk store without a run folder)."""

    kind: str = "device"
    folder: Optional[Path] = None
    temporary: bool = False


class Lifted(NamedTuple):
    """How the program jits a function: `lift(fn, batched)` puts the member axis on the
    arguments marked batched (`mcfl.runs.program.over_members`), `jit_options` go to
    `jax.jit`."""

    lift: Callable
    jit_options: dict


class StoredRounds:
    """The rounds, evaluation and checkpoints of `algorithm` with its rows in the store at
    `place` (module docstring). `hp(values, private)` are the algorithm's hyperparameters;
    `members`: whether values, state and keys carry a member axis."""

    def __init__(self, algorithm: FederatedAlgorithm, transform: MessageTransform, hp,
                 run_plan, place: StorePlace, members: bool, lifted: Lifted,
                 reads_state: bool):
        self.algorithm, self.transform, self.hyperparams = algorithm, transform, hp
        self.kind, self.folder, self.temporary = place
        self.members = members
        self.reads_state = reads_state  # participants depend on the state a round changes
        self.rows_kept = algorithm.rows  # else: a streamed start
        self.rows: Optional[StoredRows] = None
        self.initial = None  # the algorithm's state right after init (fresh rows come from it)
        self.layout: Optional[RowLayout] = None
        self.num_clients: Optional[int] = None
        self._manifest = None
        if self.rows_kept:  # (`run_plan`: the run's execution plan, `RunPlan`)
            self._jit(run_plan.model, run_plan.eval_block, lifted)

    def _jit(self, model, eval_block: int, lifted: Lifted) -> None:
        algorithm, client_state = self.algorithm, self.algorithm.client_state
        train = train_rows(algorithm, self.transform)
        hp = self.hyperparams

        def sample(state, data, rounds_key, r):
            return round_participants(algorithm, state.algorithm, data,
                                      jax.random.fold_in(rounds_key, r), r)

        def round_(values, state, gathered, chosen, data, rounds_key, r, initial):
            (packed, written), (clients, present) = gathered, chosen
            stored = with_fresh(client_state, initial, self.layout.unpack_device(packed),
                                written, clients)
            key = jax.random.fold_in(rounds_key, r)
            shared, transform_state, new, metrics = train(state, stored, clients, present,
                                                          data, key, hp(values))
            return (DeviceState(shared, None, transform_state), self.layout.pack_device(new),
                    jax.tree.map(lambda m: m[None], metrics))

        def evaluate_chunk(state, packed, written, clients, data, initial):
            described = algorithm.client_models(state.algorithm, data)
            apply_fn = described.apply or model.apply
            data = described.held(data)
            return evaluate_rows(client_state, apply_fn, eval_block, state.algorithm,
                                 initial, self.layout.unpack_device(packed), written, clients,
                                 data)

        def assignments(state):
            return algorithm.assignments(state.algorithm)

        def test_counts(state, data):
            """The clients' test rows as they hold them now (a shift moves them)."""
            described = algorithm.client_models(state.algorithm, data)
            return described.held(data).test_counts

        lift, options = lifted
        self._sample = jax.jit(lift(sample, (True, False, True, False)), **options)
        batched = dict(values=True, state=True, gathered=True, chosen=True, data=False,
                       rounds_key=True, r=False, initial=True)
        self._round = jax.jit(lift(round_, tuple(batched.values())), **options)
        batched = dict(state=True, packed=True, written=True, clients=False, data=False,
                       initial=True)
        self._evaluate_chunk = jax.jit(lift(evaluate_chunk, tuple(batched.values())),
                                       **options)
        self._assignments = (jax.jit(lift(assignments, (True,)), **options)
                             if algorithm.assignments is not None else None)
        self._test_counts = jax.jit(lift(test_counts, (True, False)), **options)

    # ---- the member axis: the store always has one, a single run's arrays get it here
    def _with_members(self, x):
        return x if self.members else jax.tree.map(lambda a: np.asarray(a)[None], x)

    def _without_members(self, x):
        return x if self.members else jax.tree.map(lambda a: a[0], x)

    def _one(self, tree):
        """A member's part of `tree` (abstract): the shapes a row is made for."""
        return (jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), tree)
                if self.members else tree)

    # ---- compile
    def round_programs(self, values, state, rounds_keys, data) -> dict:
        """The round and the evaluation of the rows in the store: drawing the round's clients
        (`sample`), the round on their gathered rows, the evaluation of a chunk of clients,
        and what evaluation asks of the state (assignments, test counts)."""
        self.num_clients = int(data.num_clients)
        initial = self.initial if self.initial is not None else state.algorithm
        self._shape_rows(initial)
        first = jnp.asarray(1, jnp.int32)
        clients, present = jax.eval_shape(self._sample, state, data, rounds_keys, first)
        written = jax.ShapeDtypeStruct(clients.shape, jnp.bool_)
        chunk = self.eval_chunk()
        member = clients.shape[:-1]
        programs = {
            "sample": (self._sample, (state, data, rounds_keys, first)),
            "round": (self._round, (values, state, (self._packed_like(clients.shape), written),
                                    (clients, present), data, rounds_keys, first, initial)),
            "evaluate": (self._evaluate_chunk, (
                state, self._packed_like(member + (chunk,)),
                jax.ShapeDtypeStruct(member + (chunk,), jnp.bool_),
                jax.ShapeDtypeStruct((chunk,), jnp.int32), data, initial)),
        }
        if self._assignments is not None:
            programs["assignments"] = (self._assignments, (state,))
        programs["test_counts"] = (self._test_counts, (state, data))
        return programs

    def _shape_rows(self, initial) -> None:
        """The layout of one client's stored row and the floats it is evaluated with, for an
        algorithm state like `initial`."""
        client_state = self.algorithm.client_state
        one = self._one(initial)
        row = jax.eval_shape(lambda s: to_storage(client_state.fresh(
            s, jnp.zeros((1,), jnp.int32)), client_state.dtype), one)
        self.layout = RowLayout.of(jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), row))
        self.evaluated_floats = evaluated_floats(client_state, one)

    def _packed_like(self, shape):
        """Abstract packed rows [*shape, row_bytes]."""
        return jax.ShapeDtypeStruct(tuple(shape) + (self.layout.row_bytes,), jnp.uint8)

    def eval_chunk(self) -> int:
        return evaluation_chunk(self.num_clients, self.evaluated_floats)

    # ---- init
    def started(self, state, data, member_count: int) -> None:
        """`init` made `state`: the store, empty (every row fresh from that state)."""
        self.num_clients = int(data.num_clients)
        self.initial = state.algorithm
        self._shape_rows(self.initial)
        self.close()  # (a sweep's earlier chunk's store, and its temporary folder, go)
        self.rows = StoredRows(make_store(self.kind, member_count, self.num_clients,
                                          self.layout.row_bytes, self.folder))

    # ---- rounds
    def round(self, compiled: dict, values, state, data, rounds_keys, first: int,
              last_round: int):
        """Round `first` on the rows in the store: (new state, metrics on the host)."""
        clients, present = self.participants(compiled, state, data, rounds_keys, first)
        packed, written = self.rows.gather(first, clients)
        upcoming = None
        if first < last_round and not self.reads_state:
            # (drawn before this round is queued on the device, which would run it first)
            upcoming = self.participants(compiled, state, data, rounds_keys, first + 1)[0]
        put = self._without_members
        state, new_rows, metrics = compiled["round"](
            values, state, (jax.device_put(put(packed)), put(written)),
            (put(clients), None if present is None else put(present)), data, rounds_keys,
            jnp.asarray(first, jnp.int32), self.initial)
        if first < last_round and self.reads_state:  # (the clock moved: the new state's)
            upcoming = self.participants(compiled, state, data, rounds_keys, first + 1)[0]
        self.rows.wait_writes()  # the previous round's rows are in the store
        if upcoming is not None:  # fetch the next round's rows while this one runs
            self.rows.prefetch(first + 1, upcoming, clients)
        self.rows.scatter(clients, self._with_members(np.asarray(jax.device_get(new_rows))),
                          first)
        return state, jax.device_get(metrics)

    def participants(self, compiled: dict, state, data, rounds_keys, r: int):
        """([M, S] clients, [M, S] present or None) of round `r`, on the host."""
        clients, present = compiled["sample"](state, data, rounds_keys,
                                              jnp.asarray(r, jnp.int32))
        clients = self._with_members(np.asarray(jax.device_get(clients), np.int64))
        if present is not None:
            present = self._with_members(np.asarray(jax.device_get(present)))
        return clients, present

    # ---- evaluation
    def evaluate(self, compiled: dict, state, data):
        """(counts, test_counts, assignments or None) of every client, chunk by chunk."""
        chunk, c = self.eval_chunk(), self.num_clients
        parts = []
        for lo, packed, written in self.rows.chunks(chunk):
            clients = jnp.minimum(lo + jnp.arange(chunk, dtype=jnp.int32), c - 1)
            counts = compiled["evaluate"](state, jax.device_put(self._without_members(packed)),
                                          self._without_members(written), clients, data,
                                          self.initial)
            parts.append(jax.device_get(counts))
        axis = 1 if self.members else 0
        counts = jax.tree.map(lambda *p: np.concatenate(p, axis=axis).take(
            np.arange(c), axis=axis), *parts)
        assigned = (compiled["assignments"](state) if self._assignments is not None
                    else None)
        test_counts = np.asarray(jax.device_get(compiled["test_counts"](state, data)))
        return EvalCounts(*counts), test_counts, jax.device_get(assigned)

    # ---- checkpoints
    def checkpoint_state(self, round_: int, state) -> dict[str, Any]:
        """What a checkpoint of round `round_` saves: the state and the store's manifest."""
        self._manifest = self.rows.manifest(round_)
        return {"state": state, "store": self._manifest}

    def checkpointed(self) -> None:
        self.rows.checkpointed(self._manifest)

    def checkpoint_template(self, state) -> dict[str, Any]:
        return {"state": state, "store": self.rows.manifest_template()}

    def restored(self, saved):
        self.rows.restore(saved["store"])
        return saved["state"]

    def move_to(self, folder: Path) -> None:
        """The run folder moved (a replaced run swapped in): the store is now in `folder`."""
        self.folder = folder
        if self.rows is not None:
            self.rows.move_to(folder)

    def close_rows(self) -> None:
        if self.rows is not None:
            rows, self.rows = self.rows, None
            rows.close()

    def close(self) -> None:
        """Wait for the writes in flight; a temporary folder is removed, a run folder's
        store stays (its checkpoints name its rows)."""
        try:
            self.close_rows()
        finally:
            if self.temporary and self.folder is not None:  # (made even when nothing was kept)
                shutil.rmtree(self.folder, ignore_errors=True)

