"""A run's programs compiled by the TPU compiler on a machine without a TPU.

With the ``tpu-aot`` extra (``pip install -e '.[tpu-aot]'``: libtpu, the TPU compiler that
matches mcfl's jax), `jax.experimental.topologies.get_topology_desc` describes the devices of
a TPU slice that is not here, and a jitted program lowered with its arguments placed on those
devices (`jax.ShapeDtypeStruct`s with shardings) is compiled by the TPU compiler itself: jax's
ahead-of-time path, ``jax.jit(f).lower(*shapes).compile()``. Lowering (`mcfl.planning.
lowering`) only checks that every operation has a TPU rule; the compiled program says what
only the compiler knows:

* each device's memory (XLA's memory analysis): arguments, outputs, temporaries and generated
  code as laid out on the TPU, whose tiles pad an array's two minor dimensions to 8 x 128
  (sublanes x lanes; half as many rows for 16-bit types), less what a donated argument lends;
* FLOPs and bytes accessed per device (XLA's cost analysis, each loop body counted once, as
  `mcfl.planning.cost` explains) and the fused kernels it made;
* whether it fits: the compiler refuses a program whose buffers exceed the HBM it can use
  (RESOURCE_EXHAUSTED, naming the bytes needed and available: 7.48 GiB a TPU v2 core, 15.75
  GiB a v5e chip, 31.25 GiB a v6e chip with libtpu 0.0.42.1).

A run is placed as it is on the real slice (`mcfl.runs.runner`): the clients dealt over the
slice's devices (a TPU v2 chip's two cores are two devices; from v4 on a chip is one), the
data, keys and values replicated on each, the state where the compiled initialisation leaves
it; the programs are built for the ``tpu`` platform (`mcfl.runs.execution.plan_run`'s
`backend`: block sizes, XLA's convolution), and the client store is the one ``auto`` would
choose on that TPU's HBM (`mcfl.store.choose.choose_store`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Optional

import jax
import numpy as np
from jax.experimental import topologies

from mcfl.engine.blocks import CLIENT_AXIS
from mcfl.errors import McflError, first_line
from mcfl.planning.cost import Cost, Trips, program_cost
from mcfl.runs.execution import plan_run, run_keys
from mcfl.runs.program import run_program

PLATFORM = "tpu"


class Topology(NamedTuple):
    target: str  # `mcfl plan`'s name (mcfl.planning.targets)
    name: str  # libtpu's topology name
    chips_per_host_bounds: Optional[tuple[int, int, int]]  # (None: libtpu's default)
    device_kind: str  # what its devices report (`jax.Device.device_kind`)


# Colab's TPU runtimes and a v5e host of 8 chips. A v5e or v6e slice of one chip needs
# chips_per_host_bounds (1, 1, 1): libtpu's default host holds 4 or 8.
TOPOLOGIES = {t.target: t for t in (
    Topology("tpu-v2-8", "v2:2x2", None, "TPU v2"),
    Topology("tpu-v5e-1", "v5e:1x1", (1, 1, 1), "TPU v5 lite"),
    Topology("tpu-v5e-8", "v5e:2x4", None, "TPU v5 lite"),
    Topology("tpu-v6e-1", "v6e:1x1", (1, 1, 1), "TPU v6 lite"),
)}


class TpuCompileError(McflError):
    """libtpu is missing, cannot describe a topology, or refuses a program for a reason other
    than memory (an operation the TPU compiler does not take): names the program."""


def missing() -> Optional[str]:
    """Why the TPU compiler cannot be used here (None: it can)."""
    if importlib.util.find_spec("libtpu") is None:
        return ("the TPU compiler (libtpu) is not installed: pip install -e '.[tpu-aot]' "
                "(or 'mcfl[tpu-aot]')")
    return None


def libtpu_version() -> str:
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return "?"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep what libtpu writes to the process's stderr on first use (it looks for a TPU's
    environment, finds none, and says so) off the user's terminal."""
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to redirect
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@functools.cache
def devices(target: str) -> tuple:
    """The devices of `target`'s TPU slice (`TOPOLOGIES`), described by libtpu."""
    if target not in TOPOLOGIES:
        raise TpuCompileError(f"no TPU topology for target {target!r}; those compiled: "
                              f"{', '.join(TOPOLOGIES)}")
    reason = missing()
    if reason is not None:
        raise TpuCompileError(reason)
    topology = TOPOLOGIES[target]
    extra = ({} if topology.chips_per_host_bounds is None
             else {"chips_per_host_bounds": topology.chips_per_host_bounds})
    try:
        with _quiet():
            found = topologies.get_topology_desc(topology_name=topology.name,
                                                 platform=PLATFORM, **extra).devices
    except Exception as error:  # libtpu's own errors carry no common type
        raise TpuCompileError(f"libtpu {libtpu_version()} cannot describe the topology "
                              f"{topology.name!r} ({target}): {first_line(error)}") from None
    return tuple(found)


@contextlib.contextmanager
def _outside_compilation_cache() -> Iterator[None]:
    """Keep TPU executables out of JAX's persistent compilation cache (`mcfl.runtime.
    compile_cache`): the compiler here has no TPU client to load one back with, so an entry
    would only make the next process warn ("Error reading persistent compilation cache
    entry") and compile again. Nothing is written (no compile is slow enough), and such a
    warning from an entry some other process wrote is not the user's concern."""
    option = "jax_persistent_cache_min_compile_time_secs"
    kept = getattr(jax.config, option)
    jax.config.update(option, float("inf"))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Error reading persistent compilation "
                                    "cache entry")
            yield
    finally:
        jax.config.update(option, kept)


class Placement(NamedTuple):
    """How a program's arguments sit on a slice: the mesh its clients are dealt over (None for
    one device) and the sharding every replicated argument takes."""

    mesh: Optional[jax.sharding.Mesh]
    replicated: jax.sharding.Sharding

    def context(self):
        return contextlib.nullcontext() if self.mesh is None else jax.set_mesh(self.mesh)

    def place(self, tree):
        """Every leaf of `tree` (arrays or shapes) as a `jax.ShapeDtypeStruct` on the slice:
        a leaf already placed there keeps its sharding, any other is replicated."""
        slice_devices = set(self.replicated.device_set)

        def one(x):
            sharding = getattr(x, "sharding", None)
            if sharding is not None and set(sharding.device_set) == slice_devices:
                return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
            return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=self.replicated)

        return jax.tree.map(one, tree)


def placement(target: str) -> Placement:
    """`target`'s slice as the runner uses a machine's devices: one device plain, more as a 1-D
    mesh over the client axis (`mcfl.engine.blocks.client_mesh`)."""
    found = devices(target)
    if len(found) == 1:
        return Placement(None, jax.sharding.SingleDeviceSharding(found[0]))
    mesh = jax.sharding.Mesh(np.array(found), (CLIENT_AXIS,),
                             axis_types=(jax.sharding.AxisType.Auto,))
    return Placement(mesh, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


class CompiledProgram(NamedTuple):
    """One program as the TPU compiler compiled it; bytes and FLOPs per device."""

    name: str
    kind: str  # init | round | evaluate: what its calls count towards
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int  # outputs written over donated arguments
    code_bytes: int
    logical_bytes: int  # its arguments and outputs at their shapes' sizes (no tile padding)
    flops: float  # XLA's cost analysis: each loop body once
    bytes_accessed: float
    fusions: int  # fused kernels in the program (each loop body's once)
    seconds: float  # to lower and compile
    counted: Cost  # mcfl's count of the same program on a device, every loop as it runs
    counted_once: Cost  # ... with each loop body once, as XLA counts
    calls: float = 1.0  # in the whole run
    rounds_per_call: int = 0  # rounds one call runs (0: not a round)

    @property
    def need_bytes(self) -> int:
        """What the program holds on a device while it runs."""
        return (self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes
                + self.code_bytes)

    @property
    def padding_bytes(self) -> int:
        """What the TPU's layouts add to its arguments and outputs."""
        return self.argument_bytes + self.output_bytes - self.logical_bytes

    def per_device(self) -> Cost:
        """One call's work on a device: the compiler's FLOPs and bytes, which count each loop
        body once, plus mcfl's count of the loops' further passes (`counted` less
        `counted_once`). Not the compiler's figures times the passes: work it hoists out of a
        loop (a copy of the data made once a call) would be counted as often as the loop runs.
        Its matmul share is mcfl's count's."""
        flops = self.flops + max(0.0, self.counted.flops - self.counted_once.flops)
        share = self.counted.matmul_flops / self.counted.flops if self.counted.flops else 0.0
        return Cost(flops, flops * share, self.bytes_accessed
                    + max(0.0, self.counted.bytes - self.counted_once.bytes))


class Refusal(NamedTuple):
    """A program the TPU compiler would not compile for lack of memory."""

    name: str
    message: str  # the compiler's first line
    required_bytes: Optional[int]
    available_bytes: Optional[int]


class OutOfMemory(McflError):
    """The TPU compiler refused a program: its buffers exceed the device's HBM."""

    def __init__(self, refusal: Refusal):
        super().__init__(f"{refusal.name}: {refusal.message}")
        self.refusal = refusal


_SIZE = r"([0-9.]+)([KMGT]?)i?B?"
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _bytes_in(pattern: str, text: str) -> Optional[int]:
    found = re.search(pattern, text)
    if found is None:
        return None
    return int(float(found.group(1)) * _UNITS[found.group(2)])


def refusal_of(name: str, error: Exception) -> Optional[Refusal]:
    """The out-of-memory refusal in a compile error (None for any other error). The compiler
    says, e.g., "Ran out of memory on HBM, the total memory required for HLO temporaries
    (30.00G) exceeds available HBM (15.75G)" (G: GiB)."""
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text and "out of memory" not in text.lower():
        return None
    line = next((ln for ln in text.splitlines() if "memory" in ln.lower()), first_line(error))
    required = (_bytes_in(r"required[^(]*\(" + _SIZE + r"\)", line)
                or _bytes_in(r"[Uu]sed " + _SIZE, line))
    available = (_bytes_in(r"available HBM \(" + _SIZE + r"\)", line)
                 or _bytes_in(r"of " + _SIZE + r" hbm", line))
    return Refusal(name, line.strip()[:300], required, available)


def _logical_bytes(tree) -> int:
    """Bytes of a tree of placed shapes on one device, at their shard's shape."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += int(np.prod(shape)) * _itemsize(x.dtype)
    return total


def _itemsize(dtype) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):  # a key's words
        words = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct((), dtype))
        return int(np.prod(words.shape)) * words.dtype.itemsize
    return np.dtype(dtype).itemsize


FUSION = re.compile(r"=\s*\S+\s+fusion\(")


def compile_program(name: str, fn: Callable, args: tuple, where: Placement,
                    trips: Optional[Trips] = None, kind: str = "") -> tuple[
        CompiledProgram, Any]:
    """`fn` (a jitted function) compiled for the slice on arguments like `args`, placed by
    `where`: its `CompiledProgram` and its outputs' placed shapes (what a next program takes).
    `trips`: the mean iterations of the clients' loops (`mcfl.planning.cost`), for mcfl's own
    count of the program. Raises `OutOfMemory` when the compiler refuses it for memory,
    `TpuCompileError` for any other refusal."""
    start = time.perf_counter()
    placed = where.place(args)
    try:
        with where.context(), _quiet(), _outside_compilation_cache():
            traced = fn.trace(*placed)
            compiled = traced.lower().compile()
    except Exception as error:  # XLA's errors have no narrower common type
        refusal = refusal_of(name, error)
        if refusal is not None:
            raise OutOfMemory(refusal) from None
        raise TpuCompileError(f"the TPU compiler refused {name}: {first_line(error)[:300]}"
                              ) from None
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, (list, tuple)):  # older jax: one per device program
        cost = cost[0] if cost else {}
    outputs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                          sharding=x.sharding),
                           compiled.out_info)
    program = CompiledProgram(
        name=name, kind=kind or name, argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes), temp_bytes=int(memory.temp_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        code_bytes=int(memory.generated_code_size_in_bytes),
        logical_bytes=_logical_bytes(placed) + _logical_bytes(outputs),
        flops=float(cost.get("flops", 0.0)),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        fusions=len(FUSION.findall(compiled.as_text() or "")), seconds=seconds,
        counted=program_cost(traced.jaxpr, trips),
        counted_once=program_cost(traced.jaxpr, trips, each_loop_once=True))
    return program, outputs


class CompiledRun(NamedTuple):
    """A run's programs compiled for one TPU target."""

    target: str
    device_kind: str
    devices: int
    hbm_bytes: Optional[int]  # what the compiler lets a device's buffers use
    store: str  # the client store the run would use there, and why
    programs: tuple[CompiledProgram, ...]
    refused: Optional[Refusal]  # the first program refused for memory (None: all compiled)
    seconds: float
    libtpu: str

    @property
    def need_bytes(self) -> Optional[int]:
        """The most any program holds on a device (a refused program: what the compiler said
        it needs)."""
        if self.refused is not None:
            return self.refused.required_bytes
        return max((p.need_bytes for p in self.programs), default=0)

    @property
    def fits(self) -> bool:
        need = self.need_bytes
        return (self.refused is None and
                (self.hbm_bytes is None or need is None or need <= self.hbm_bytes))

    def program(self, name: str) -> Optional[CompiledProgram]:
        return next((p for p in self.programs if p.name == name), None)


def round_name(name: Any) -> str:
    """A program's name for the reader: a device program's rounds are keyed by how many
    rounds one call runs (`mcfl.runs.program.RoundProgram.round_programs`)."""
    if isinstance(name, int):
        return "round" if name == 1 else f"{name} rounds"
    return str(name)


def compile_run(plan, dataset, target: str, trips: Optional[Trips] = None) -> CompiledRun:
    """The programs of `plan` (a `mcfl.runs.plan.Plan`) on `dataset` (a `FederatedDataset`),
    built for the TPU and compiled for `target`'s slice (module docstring): the
    initialisation, the rounds of every chunk length and the evaluation, or a host store's
    programs where ``auto`` would keep the clients' rows off that TPU, each with its calls in
    the whole run. `trips`: the clients'
    loops' mean iterations (`mcfl.planning.estimate.client_loop_trips`). A program refused
    for memory ends it (`CompiledRun.refused`); any other refusal raises `TpuCompileError`."""
    start = time.perf_counter()
    where = placement(target)
    hbm = hbm_available(target)
    run_plan = plan_run(plan, dataset, backend=PLATFORM)
    data = dataset.arrays
    # The data stay on the device for the whole run, used by a program or not: kept as its
    # arguments, so that its memory analysis counts them.
    program, store = run_program(plan, run_plan, data, None,
                                 jit_options={"keep_unused": True}, accelerator_free=hbm)
    init_key, rounds_key = run_keys(plan.seed)
    values: dict = {}
    compiled: list[CompiledProgram] = []
    refused = None
    try:
        state = None
        for name, (fn, args) in program.init_programs(values, init_key, data).items():
            done, state = compile_program(round_name(name), fn, args, where, trips, "init")
            compiled.append(done)
        if state is None:  # a start streamed through the store: its state's shapes
            with where.context():
                state = where.place(jax.eval_shape(program._init, *where.place(
                    (values, init_key, data))))
        # (built outside the slice's mesh: they make a concrete round number here)
        rounds = program.round_programs(values, state, rounds_key, data)
        for name, (fn, args) in rounds.items():
            kind, calls, per_call = _calls(program, name)
            done, _ = compile_program(round_name(name), fn, args, where, trips, kind)
            compiled.append(done._replace(calls=calls, rounds_per_call=per_call))
    except OutOfMemory as error:
        refused = error.refusal
    finally:
        program.close()
    return CompiledRun(target, str(devices(target)[0].device_kind), len(devices(target)), hbm,
                       f"{store.kind}: {store.reason}", tuple(compiled), refused,
                       time.perf_counter() - start, libtpu_version())


def _calls(program, name) -> tuple[str, float, int]:
    """(kind, calls in the run, rounds a call runs) of one of `program`'s round programs."""
    evaluations = program.chunks.evaluations
    if isinstance(name, int):  # a device program's chunk of `name` rounds
        return "round", float(program.chunks.lengths().get(name, 0)), name
    if name in ("sample", "round"):  # a host store's: one round a call
        return "round", float(program.run_plan.rounds), 1 if name == "round" else 0
    if name == "evaluate" and program.rows_kept:  # a host store's: a chunk of clients a call
        chunks = -(-int(program.stored.num_clients) // program.stored.eval_chunk())
        return "evaluate", float(evaluations * chunks), 0
    return "evaluate", float(evaluations), 0


@functools.cache
def hbm_available(target: str) -> Optional[int]:
    """The HBM a device of `target` offers a program's buffers, as the TPU compiler states it
    when it refuses a program far too large for it (None when it does not say)."""
    where = placement(target)
    huge = jax.ShapeDtypeStruct((2**38,), np.float32, sharding=where.replicated)  # 1 TiB
    try:
        compile_program("probe", jax.jit(lambda a: a + 1), (huge,), where)
    except OutOfMemory as refused:
        return refused.refusal.available_bytes
    return None


__all__ = ["TOPOLOGIES", "CompiledProgram", "CompiledRun", "OutOfMemory", "Placement",
           "Refusal", "TpuCompileError", "compile_program", "compile_run", "devices",
           "hbm_available", "missing", "placement"]
