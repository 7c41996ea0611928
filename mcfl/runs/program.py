"""The round program: one plan's initialisation, rounds and evaluation as compiled programs.

Built from a run's plan (`mcfl.runs.plan`) and its execution plan (`mcfl.runs.execution`), as
purejaxrl's ``make_train(config)`` is: `RoundProgram` builds the algorithm once
(`Plan.build_algorithm`, with the execution plan's block size in its context), runs it on the
device (`mcfl.algorithms.framework.device.on_device`, with the run's message transform) and gives
three jittable functions of the *traced values* (a
dict of the settings a sweep varies, by flat key: `mcfl.sweeps.spec`; empty for a single run,
whose numbers are baked into the program):

* ``init(values, init_key, data) -> state``;
* ``rounds[count](values, state, data, rounds_key, first) -> (state, metrics [count])``: one
  round, or with ``run_plan.scan_rounds`` `count` rounds as one `lax.scan`;
* ``evaluate(values, state, data) -> (counts, test_counts, assignments)``.

Each builds the algorithm's hyperparameters (`Hyperparams`) from the plan and the values,
so a swept float is an argument, never a reason to rebuild anything. The seeds are arguments
too (the keys), so `round_program` keeps the last few programs: runs of one plan with other
seeds (``for s in seeds: mcfl.run(config.replace(seed=s), dataset=data)``) compile once.
With ``members=True`` every function takes a leading member axis on the values, state and
keys (the data is shared): the members of a sweep run side by side (vmapped) or one after
another in the same program (`over_members`), dealt over the devices of a member mesh.
`mcfl.run` is the one-member case without that axis. The host loop over the rounds is
`mcfl.runs.loop`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from mcfl import engine
from mcfl.algorithms import FederatedAlgorithm
from mcfl.algorithms.framework.device import (
    DeviceState,
    evaluation_counts,
    newcomer_models,
    on_device,
    scan_rounds,
)
from mcfl.data import FederatedDataset
from mcfl.engine.newcomers import most_confident
from mcfl.errors import ConfigError
from mcfl.runs.evaluation import ClientMetrics, client_metrics
from mcfl.runs.execution import RunPlan
from mcfl.runs.loop import round_chunks
from mcfl.runs.plan import Plan
from mcfl.runs.stored_rounds import Lifted, StoredRounds, StorePlace
from mcfl.runtime import distributed
from mcfl.store import FOLDER as STORE_FOLDER
from mcfl.store.choose import StoreChoice, choose_store
from mcfl.store.start import streamed_start
from mcfl.transforms import initial_state

MEMBER_AXIS = "members"
ON_DEVICE = StorePlace()  # the client rows in the run's state on the device


def evaluate(algorithm: FederatedAlgorithm, state, dataset: FederatedDataset, apply_fn,
             block_size: int) -> ClientMetrics:
    """Per-client test metrics of the models `algorithm` assigns to each client (`state`: a
    `mcfl.algorithms.framework.device.DeviceState`)."""
    counts, test_counts = jax.device_get(jax.jit(functools.partial(
        evaluation_counts, algorithm, apply_fn, block_size))(state, dataset.arrays))
    return client_metrics(counts, np.asarray(test_counts))


def member_mesh(devices: int) -> Optional[jax.sharding.Mesh]:
    """The mesh dealing members over `devices` devices (None for one)."""
    if devices == 1:
        return None
    return jax.make_mesh((devices,), (MEMBER_AXIS,), (jax.sharding.AxisType.Auto,),
                         devices=jax.devices()[:devices])


def over_members(fn: Callable, batched: tuple[bool, ...], mesh: Optional[jax.sharding.Mesh],
                 width: Optional[int] = None):
    """`fn` over the member axis of the arguments marked `batched` (the others, the data and
    the round number, are shared): `width` members at a time side by side (vmapped), those
    groups one after another (`lax.map`); None: all side by side. On a mesh, the members are
    dealt over its devices first."""
    def mapped(*args):
        xs = tuple(a for a, b in zip(args, batched) if b)
        shared = [a for a, b in zip(args, batched) if not b]

        def one(x):
            own, rest = iter(x), iter(shared)
            return fn(*(next(own) if b else next(rest) for b in batched))

        count = jax.tree.leaves(xs)[0].shape[0]
        if width is None or width >= count:
            return jax.vmap(one)(xs)
        return jax.lax.map(one, xs, batch_size=width if width > 1 else None)

    if mesh is None:
        return mapped
    spec = jax.sharding.PartitionSpec(MEMBER_AXIS)
    shared = jax.sharding.PartitionSpec()
    return jax.shard_map(mapped, mesh=mesh, in_specs=tuple(spec if b else shared
                                                           for b in batched),
                         out_specs=spec, check_vma=False)  # members never mix


def footprint(compiled) -> Optional[int]:
    """Bytes a compiled program holds while it runs, by XLA's memory analysis."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # some backends have none
        return None
    if m is None:
        return None
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes)


class RoundProgram:
    """The compiled programs of `plan` on its execution plan `run_plan` (see the module
    docstring).

    `traced`: the flat keys whose values are arguments (a sweep group's varied settings).
    `members`: a leading member axis on values, state and keys; `mesh` deals it over devices
    and `width` members run side by side. `jit_options`: extra `jax.jit` arguments (a
    multi-process run's replicated outputs). `transform`: what every client message goes
    through is the plan's (`mcfl.transforms`; DP's mechanism with --dp-clip).
    """

    def __init__(self, plan: Plan, run_plan: RunPlan, traced: Sequence[str] = (),
                 members: bool = False, mesh: Optional[jax.sharding.Mesh] = None,
                 width: Optional[int] = None, jit_options: Optional[dict] = None,
                 place: StorePlace = ON_DEVICE):
        if place.kind != "device":  # rows read and written by the host: one round a call
            run_plan = run_plan._replace(scan_rounds=False)
        self.plan, self.run_plan, self.traced, self.members = (plan, run_plan, tuple(traced),
                                                               members)
        transform = plan.transform
        if run_plan.privacy is not None:  # the plan's DP is the run's transform
            transform = run_plan.privacy.transform()
        self.transform = transform
        model = run_plan.model
        self.algorithm = algorithm = plan.build_algorithm(model, run_plan.clients_per_round,
                                                          run_plan.train_block)
        self.device = device = on_device(algorithm, transform)
        self.clustered = algorithm.assignments is not None
        self.scanned = scanned = run_plan.scan_rounds
        self.chunks = round_chunks(run_plan.rounds, plan.evaluation.eval_every, scanned,
                                   plan.execution.checkpoint_every)
        self.compile_seconds = 0.0
        jit_options = jit_options or {}

        def hp(values):
            return plan.hyperparams(model, values, run_plan.privacy)

        def init(values, init_key, data):
            if place.kind == "device":
                return device.init(data, init_key, hp(values))
            params = hp(values)  # (the rows start in the store: none on the device)
            return DeviceState(algorithm.init(data, init_key, params), None,
                               initial_state(transform, params.privacy))

        def rounds(count, values, state, data, rounds_key, first):
            if scanned:
                return scan_rounds(device, hp(values), state, data, rounds_key, first, count)
            state, metrics = device.round(state, data, jax.random.fold_in(rounds_key, first),
                                          hp(values), first)
            return state, jax.tree.map(lambda m: m[None], metrics)

        lift = (functools.partial(over_members, mesh=mesh, width=width) if members
                else lambda fn, batched: fn)
        self._init = jax.jit(lift(init, (True, True, False)), **jit_options)
        self._jit_evaluation(Lifted(lift, jit_options))
        # The state is donated: an algorithm that updates part of a large state (Local's
        # [C, ...] models) does it in place instead of copying it every round.
        self._rounds = {count: jax.jit(lift(functools.partial(rounds, count),
                                            (True, True, False, True, False)),
                                       donate_argnums=(1,), **jit_options)
                        for count in sorted({count for _, count in self.chunks})}
        # name -> (the signature of the arguments it was compiled for, the executable)
        self._compiled: dict[Any, tuple[Any, Any]] = {}
        self.stored: Optional[StoredRounds] = None  # the rows in a host or disk store
        if place.kind != "device":
            system = plan.participation.system
            self.stored = StoredRounds(
                algorithm, transform, self.hyperparams, run_plan, place, members,
                Lifted(lift, jit_options),
                reads_state=system is not None and system.samples_itself)

    def _jit_evaluation(self, lifted: Lifted) -> None:
        """The evaluation of the clients and of the held-out newcomers, jitted."""
        algorithm, run_plan = self.algorithm, self.run_plan
        model, block = run_plan.model, run_plan.eval_block

        def evaluate_(values, state, data):
            del values  # evaluation depends on the state alone
            counts, test_counts = evaluation_counts(algorithm, model.apply, block, state, data)
            assigned = algorithm.assignments(state.algorithm) if self.clustered else None
            return counts, test_counts, assigned

        def evaluate_unseen_(values, state, data, unseen):
            del values
            offered = newcomer_models(algorithm, state.algorithm, data, unseen)
            if offered is None:  # per-client models: nothing to serve a newcomer with
                return None
            models, index = offered
            if index is None:
                index = most_confident(model.apply, unseen, models, block)
            counts = engine.evaluate_counts(model.apply, unseen, models, index, block)
            return counts, unseen.test_counts, index

        lift, options = lifted
        self._evaluate = jax.jit(lift(evaluate_, (True, True, False)), **options)
        self._evaluate_unseen = jax.jit(lift(evaluate_unseen_, (True, True, False, False)),
                                        **options)

    def hyperparams(self, values, private: bool = True):
        """The algorithm's hyperparameters (`Hyperparams`) for the traced `values`, with DP's
        numbers when the run has DP and `private` (a population start's points are trained
        without them)."""
        return self.plan.hyperparams(self.run_plan.model, values,
                                     self.run_plan.privacy if private else None)

    def values(self, configs: Sequence[Any]) -> dict[str, jax.Array]:
        """The traced values of the members' `configs` (one each, stacked [M]); {} without
        any."""
        if not self.members:
            return {}
        return {k: jnp.asarray([getattr(c, k) for c in configs], jnp.float32)
                for k in self.traced}

    def compile(self, values, init_keys, rounds_keys, data) -> Optional[int]:
        """Compile every program for arguments like these; the largest footprint in bytes
        (None when the backend cannot say)."""
        self.compile_init(values, init_keys, data)
        state = jax.eval_shape(self._init, values, init_keys, data)
        return self.compile_rounds(values, state, rounds_keys, data)

    def compile_init(self, values, init_keys, data) -> None:
        self._lower_and_compile(self.init_programs(values, init_keys, data))

    def compile_rounds(self, values, state, rounds_keys, data) -> Optional[int]:
        """Compile the rounds of every chunk length and the evaluation for a state like
        `state` (a state itself: its shardings are kept); the largest footprint of all (None
        for rows in a store, or when the backend cannot say)."""
        self._lower_and_compile(self.round_programs(values, state, rounds_keys, data))
        if self.rows_kept:
            return None
        sizes = [footprint(compiled) for _, compiled in self._compiled.values()]
        return None if None in sizes else max(sizes)

    def init_programs(self, values, init_keys, data) -> dict[Any, tuple[Callable, tuple]]:
        """The initialisation to compile, by name: {name: (jitted function, arguments)}
        (what `compile_init` compiles here and `mcfl.planning.tpu_compile` for a TPU; a start
        streamed through a store compiles its programs as it streams)."""
        if self.start_streamed:
            return {}
        return {"init": (self._init, (values, init_keys, data))}

    def round_programs(self, values, state, rounds_keys, data
                       ) -> dict[Any, tuple[Callable, tuple]]:
        """The rounds of every chunk length (by their count) and the evaluation, for a state
        like `state`: {name: (jitted function, arguments)}; with the rows in a store, its
        programs (`StoredRounds.round_programs`)."""
        if self.rows_kept:
            return self.stored.round_programs(values, state, rounds_keys, data)
        first = jnp.asarray(1, jnp.int32)
        programs = {count: (fn, (values, state, data, rounds_keys, first))
                    for count, fn in self._rounds.items()}
        programs["evaluate"] = (self._evaluate, (values, state, data))
        return programs

    def _lower_and_compile(self, programs: dict[Any, tuple[Callable, tuple]]) -> None:
        """Trace, lower and compile each of `programs` (a jitted function and its arguments),
        unless it was compiled for arguments like these."""
        start = time.perf_counter()
        todo = {name: (fn, args, signature(args)) for name, (fn, args) in programs.items()}
        todo = {name: item for name, item in todo.items()
                if self._compiled.get(name, (None,))[0] != item[2]}
        lowered = {name: (fn.lower(*args), sig) for name, (fn, args, sig) in todo.items()}
        self._compiled.update({name: (sig, lo.compile()) for name, (lo, sig) in lowered.items()})
        self.compile_seconds += time.perf_counter() - start

    def _executables(self) -> dict[Any, Any]:
        return {name: executable for name, (_, executable) in self._compiled.items()}

    def working_bytes(self, init: bool) -> Optional[int]:
        """The most bytes the compiled initialisation (`init`), or else one of the compiled
        rounds and evaluation, allocates beyond its arguments (its outputs not written over a
        donated argument, its temporaries), by XLA's memory analysis; None where the backend
        cannot say."""
        sizes = []
        for name, (_, compiled) in self._compiled.items():
            if (name == "init") != init:
                continue
            try:
                m = compiled.memory_analysis()
            except Exception:  # some backends have none
                m = None
            if m is None:
                return None
            sizes.append(int(m.output_size_in_bytes + m.temp_size_in_bytes
                             - m.alias_size_in_bytes))
        return max(sizes, default=None)

    def init(self, values, init_keys, data):
        """The initial state, computed (waited for, so that no round counts its time); with
        the rows in a store, the store made for it."""
        if self.start_streamed:
            members = int(np.shape(jax.random.key_data(init_keys))[0]) if self.members else 1
            return streamed_start(self.stored, values, init_keys, data, members)
        state = jax.block_until_ready(self._compiled["init"][1](values, init_keys, data))
        if self.rows_kept:
            members = int(np.shape(jax.random.key_data(init_keys))[0]) if self.members else 1
            self.stored.started(state, data, members)
        return state

    def initial_state(self, values, init_keys, data, resuming: bool = False):
        """`init`'s state; for a run about to restore a checkpoint, what the restore needs of
        it: the state itself (a device program's init is cheap next to its rounds), or for a
        start streamed through a store, which trains every client, only the state's shapes,
        dtypes and placement."""
        if not (resuming and self.start_streamed):
            return self.init(values, init_keys, data)
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                            jax.eval_shape(self._init, values, init_keys, data))

    def rounds(self, count: int, values, state, data, rounds_keys, first: int):
        """(new state, metrics as NumPy arrays [count], or [M, count] with members)."""
        if self.rows_kept:
            assert count == 1, "a host or disk store runs round by round"
            return self.stored.round(self._executables(), values, state, data, rounds_keys,
                                     first, self.run_plan.rounds)
        with warnings.catch_warnings():
            # Buffers of state parts an algorithm rebuilds cannot be reused; that is fine.
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            state, metrics = self._compiled[count][1](values, state, data, rounds_keys,
                                                      jnp.asarray(first, jnp.int32))
        return state, jax.device_get(metrics)

    def evaluate(self, values, state, data):
        """(counts, test_counts, assignments or None) on the host."""
        if self.rows_kept:
            return self.stored.evaluate(self._executables(), state, data)
        return jax.device_get(self._compiled["evaluate"][1](values, state, data))

    def evaluate_unseen(self, values, state, data, unseen):
        """(counts, test_counts, the model index each was served) of the held-out clients
        `unseen` (`mcfl.data.unseen`), on the host; None when the algorithm has no model to
        serve a client that never trained."""
        return jax.device_get(self._evaluate_unseen(values, state, data, unseen))

    @property
    def rows_kept(self) -> bool:
        """Whether the client rows live in a host or disk store (`StoredRounds`)."""
        return self.stored is not None and self.stored.rows_kept

    @property
    def start_streamed(self) -> bool:
        """Whether `init` is a population start through a host or disk store (FeSEM,
        Robust), after which the rounds run on the device."""
        return self.stored is not None and not self.stored.rows_kept

    @property
    def store_kind(self) -> str:
        return "device" if self.stored is None else self.stored.kind

    # What a checkpoint saves and restores beyond the state: a client store's manifest.
    def checkpoint_state(self, round_: int, state):
        return self.stored.checkpoint_state(round_, state) if self.rows_kept else state

    def checkpointed(self) -> None:
        """The checkpoint `checkpoint_state` gave was saved."""
        if self.rows_kept:
            self.stored.checkpointed()

    def checkpoint_template(self, state):
        return self.stored.checkpoint_template(state) if self.rows_kept else state

    def restored(self, saved):
        return self.stored.restored(saved) if self.rows_kept else saved

    def move_to(self, folder) -> None:
        """The run folder moved (a replaced run swapped in): a store in it moves too."""
        if self.stored is not None:
            self.stored.move_to(folder)

    def close(self) -> None:
        """The run is over: nothing in flight remains (a temporary store folder is gone)."""
        if self.stored is not None:
            self.stored.close()

    def algorithm_state(self, state):
        """The algorithm's state (`FederatedAlgorithm`) from the program's."""
        return state.algorithm


def signature(args) -> tuple:
    """What a compiled program is specific to: the arguments' structure, shapes, dtypes and
    shardings (not their values)."""
    leaves, treedef = jax.tree.flatten(args)
    return treedef, tuple((tuple(x.shape), str(x.dtype), getattr(x, "sharding", None))
                          for x in leaves)


PROGRAMS_KEPT = 8  # programs `round_program` keeps (their executables, no data)
_PROGRAMS: collections.OrderedDict[tuple, RoundProgram] = collections.OrderedDict()


def round_program(plan: Plan, run_plan: RunPlan, data, traced: Sequence[str] = (),
                  members: bool = False, mesh: Optional[jax.sharding.Mesh] = None,
                  width: Optional[int] = None, jit_options: Optional[dict] = None
                  ) -> RoundProgram:
    """`RoundProgram(plan, run_plan, ...)`, or the one already built for the same plan up to
    its seeds (keys are arguments) on data of the same shapes: the last `PROGRAMS_KEPT` are
    kept, with the executables they compiled."""
    key = (seedless(plan), plan.transform, _module_key(run_plan.model.module),
           _module_key(plan.model.model), signature(data), tuple(traced), members, mesh, width,
           repr(jit_options), run_plan.train_block, run_plan.scan_rounds, run_plan.rounds)
    if key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
        return _PROGRAMS[key]
    program = RoundProgram(plan, run_plan, traced, members, mesh, width, jit_options)
    _PROGRAMS[key] = program
    while len(_PROGRAMS) > PROGRAMS_KEPT:
        _PROGRAMS.popitem(last=False)
    return program


def seedless(plan: Plan) -> Plan:
    """`plan` with its seeds set to 0: what its compiled programs are specific to (the seeds
    reach them as keys; only canaries' directions are built from the seed into the program)."""
    privacy = plan.privacy
    if privacy is not None and privacy.canaries == 0:
        privacy = dataclasses.replace(privacy, canary_seed=0)
    return dataclasses.replace(plan, seed=0, data=dataclasses.replace(plan.data, seed=0),
                               privacy=privacy)


def _module_key(module) -> Any:
    """A model's module as a cache key: equal modules (same class and fields) share programs;
    one with unhashable fields only itself."""
    try:
        hash(module)
        return module
    except TypeError:
        return id(module)


def forget_programs() -> None:
    """Drop the programs `round_program` keeps."""
    _PROGRAMS.clear()


class MemberAxis(NamedTuple):
    """A sweep group's members on a leading axis: the flat keys whose values are traced, how
    many members, the mesh dealing them over devices and how many run side by side
    (`RoundProgram`'s `traced`, `mesh` and `width`)."""

    traced: Sequence[str] = ()
    count: int = 1
    mesh: Optional[jax.sharding.Mesh] = None
    width: Optional[int] = None


def run_program(plan: Plan, run_plan: RunPlan, data, run_dir: Optional[Path],
                members: Optional[MemberAxis] = None, jit_options: Optional[dict] = None,
                accelerator_free: Optional[int] = None) -> tuple[RoundProgram, StoreChoice]:
    """The program of `plan` with the client store it asks for (a disk store in
    ``run_dir/client_store``, or without a run folder a temporary folder the program removes
    when closed), and the store chosen; `members`: a sweep group's (None: a run's, without a
    member axis). `accelerator_free`: the memory of an accelerator the run is planned for
    (`choose_store`)."""
    axis = members or MemberAxis()
    traced, member_count, mesh, width = axis
    members = members is not None
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
              else None if run_dir is None else Path(run_dir) / STORE_FOLDER)
    if run_plan.scan_rounds:
        choice = choice._replace(reason=f"{choice.reason}; its rounds run one at a time "
                                 f"(scan_rounds needs the client state on the device)")
    program = RoundProgram(plan, run_plan, traced, members, mesh, width, jit_options,
                           StorePlace(choice.kind, folder, temporary))
    return program, choice


def announce(choice: StoreChoice) -> None:
    """Say on stderr which store a run uses and why, unless it is the device."""
    if choice.kind != "device":
        print(f"mcfl: client store: {choice.kind} ({choice.reason})", file=sys.stderr)
