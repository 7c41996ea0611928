"""What a run needs before it runs: `mcfl plan`'s work, per round and for the whole run.

`estimate_run` builds the run's programs as `mcfl.run` would (its plan, its block sizes; a
run on a host or disk client store is counted on the device program, which does the same work
with the rows on the device), compiles them for this machine without training, and counts:

* the work of each program (`mcfl.planning.cost`: FLOPs and a lower bound on bytes moved, every loop
  body counted as often as it runs), beside XLA's own cost analysis, which counts loop bodies
  once;
* the memory each compiled program holds while it runs here (XLA's memory analysis:
  arguments, results and temporaries, less what a donated argument lends);
* the sizes of the data, the model, the client state and the store the run would use.

`bound_on(estimate, target)` turns them into a target's fit and a roofline lower bound on time:
a round cannot take less than its matrix FLOPs at the target's peak, its other FLOPs at its
vector rate, or its bytes at its bandwidth (Williams, Waterman and Patterson, "Roofline",
CACM 2009). The bound says what a run cannot beat; how far real rounds are above it is
measured in BENCHMARKS.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple, Optional

import jax
import numpy as np

from mcfl.config import RunConfig
from mcfl.data import FederatedDataset
from mcfl.engine.client_data import CLIENT_ROWS_CHUNK
from mcfl.engine.evaluate import DEFAULT_EVAL_BATCH
from mcfl.engine.training import mean_steps
from mcfl.planning import tpu_compile
from mcfl.planning.cost import Cost, program_cost, traced_cost, xla_cost
from mcfl.planning.targets import Target
from mcfl.planning.tpu_compile import CompiledRun
from mcfl.runs.execution import plan_run, run_keys
from mcfl.runs.plan import resolve
from mcfl.runs.program import footprint, round_program, run_program
from mcfl.runs.runner import prepared_data


class ProgramEstimate(NamedTuple):
    name: str  # init | round | evaluate
    calls: int  # in the whole run
    cost: Cost  # of one call
    xla: dict  # XLA's cost analysis of one call (loop bodies once)
    footprint: Optional[int]  # bytes it holds while it runs here (None: unknown)


class RunEstimate(NamedTuple):
    config: RunConfig
    dataset: str
    params: int  # model parameters
    clients: int
    clients_per_round: int
    data_bytes: int  # the client data on the device
    state_bytes: int  # the run's state between rounds (client state included)
    store: str  # where client state lives (device | host | disk) and why
    stored_bytes: int  # what the store holds (0: nothing per client)
    programs: tuple[ProgramEstimate, ...]
    backend: str  # where the footprints were measured
    # a round that does its occasional work (`mcfl.planning.cost`: FlexCFL's newcomers'
    # pre-training, a migration ...); None when the round has none
    occasional_round: Optional[Cost] = None
    # client-level DP: what the planned run will spend (`mcfl.privacy.plan.PrivacyPlan.
    # summary` after its rounds), None without DP
    privacy: Optional[dict] = None
    # the run's programs compiled by the TPU compiler, one per TPU target asked for
    # (`mcfl.planning.tpu_compile`)
    compiled: tuple[CompiledRun, ...] = ()
    # what the config resolved to (`mcfl.runs.plan.Plan.describe`: every default filled in)
    resolved: Optional[dict] = None

    def program(self, name: str) -> ProgramEstimate:
        return next(p for p in self.programs if p.name == name)

    @property
    def run_cost(self) -> Cost:
        total = Cost()
        for p in self.programs:
            total += p.cost.times(p.calls)
        return total

    @property
    def peak_bytes(self) -> Optional[int]:
        sizes = [p.footprint for p in self.programs]
        return None if None in sizes else max(sizes)


class TargetBound(NamedTuple):
    target: Target
    need_bytes: Optional[float]  # per device
    fits: Optional[bool]
    round_seconds: float  # roofline lower bound on one round
    run_seconds: float  # ... on the whole run
    limit: str  # matmul | vector | memory: what bounds the round
    occasional_round_seconds: Optional[float] = None  # ... on a round doing its occasional work
    # the TPU compiler's figures, when the target's programs were compiled: then `need_bytes`
    # and `fits` are the compiler's and, unless it refused a program, so are the times
    compiled: Optional[CompiledRun] = None


def estimate_run(config: RunConfig, dataset: Optional[FederatedDataset] = None,
                 cache_dir: Optional[str | Path] = None, compile: bool = True,
                 tpu_targets: Sequence[str] = ()) -> RunEstimate:
    """Build and compile `config`'s programs here, run nothing, and count what they need.
    Without `compile`, the programs are only traced: the counts are the same, the footprints
    and XLA's own figures unknown (what `mcfl bench` needs beside a round it measured).
    `tpu_targets`: TPU targets (`mcfl.planning.tpu_compile.TOPOLOGIES`) whose programs are
    also compiled by the TPU compiler (the ``tpu-aot`` extra).
    Data that cannot fit here are refused, from the config, before they are built (as
    `mcfl.run` refuses them)."""
    resolved, dataset = prepared_data(resolve(config), dataset, cache_dir)
    config = resolved.config
    plan = plan_run(resolved, dataset)
    data = dataset.arrays
    init_key, rounds_key = run_keys(resolved.seed)
    # The store the run would use; the work is counted on the device program, whose rounds
    # do what a host or disk store's do with the client rows on the device (`bound_on` takes
    # the stored rows off a target's memory need when they would live elsewhere).
    stored, store = run_program(resolved, plan, data, None)
    stored.close()
    program = round_program(resolved, plan, data)
    try:
        values = {}
        state = jax.eval_shape(program._init, values, init_key, data)
        if compile:
            program.compile_init(values, init_key, data)
            program.compile_rounds(values, state, rounds_key, data)
        first = jax.ShapeDtypeStruct((), np.int32)
        trips = client_loop_trips(dataset)
        init_cost = traced_cost(program._init, values, init_key, data, trips=trips)
        rounds = {count: fn.trace(values, state, data, rounds_key, first).jaxpr
                  for count, fn in program._rounds.items()}
        eval_cost = traced_cost(program._evaluate, values, state, data, trips=trips)
        compiled = {name: executable for name, (_, executable) in program._compiled.items()}
        # a scanned run's chunk counts `count` rounds: a round is its share
        lengths = program.chunks.lengths()
        count = max(rounds, key=lambda c: lengths.get(c, 0))
        per_round = program_cost(rounds[count], trips).times(1 / count)
        occasional_round = None
        if per_round.occasional:
            occasional_round = program_cost(rounds[count], trips, "dearer").times(1 / count)

        def analyses(name):  # XLA's cost and memory figures of a compiled program
            if not compile:
                return {}, None
            return xla_cost(compiled[name]), footprint(compiled[name])

        programs = (
            ProgramEstimate("init", 1, init_cost, *analyses("init")),
            ProgramEstimate("round", plan.rounds, per_round, *analyses(count)),
            ProgramEstimate("evaluate", program.chunks.evaluations, eval_cost,
                            *analyses("evaluate")),
        )
    finally:
        program.close()
    compiled = tuple(tpu_compile.compile_run(resolved, dataset, target, trips)
                     for target in tpu_targets)
    return RunEstimate(
        config=config, dataset=dataset.name, params=plan.params_count,
        clients=dataset.num_clients, clients_per_round=plan.clients_per_round,
        data_bytes=_tree_bytes(data), state_bytes=_tree_bytes(state),
        store=f"{store.kind}: {store.reason}", stored_bytes=store.stored_bytes,
        programs=programs, backend=f"{jax.default_backend()} ({jax.devices()[0].device_kind})",
        occasional_round=occasional_round,
        privacy=None if plan.privacy is None else plan.privacy.summary(
            plan.privacy.epsilons()[-1]),
        compiled=compiled, resolved=resolved.describe())


def client_loop_trips(dataset: FederatedDataset) -> Callable[[str], Optional[float]]:
    """The mean iterations of each client loop (`mcfl.planning.cost`) by its name, from the
    clients' row counts: local steps of any schedule (`mcfl.engine.training.steps_key`: E x
    ceil(n_i / B), or a fixed count), chunks of training rows (full-batch gradients) and
    chunks of test rows (evaluation)."""
    train = np.asarray(dataset.train_counts(), np.float64)
    test = np.asarray(dataset.test_counts(), np.float64)
    chunks = {"chunks": float(np.ceil(train / CLIENT_ROWS_CHUNK).mean()),
              "eval_chunks": float(np.ceil(test / DEFAULT_EVAL_BATCH).mean())}

    def trips(name: str) -> Optional[float]:
        return chunks[name] if name in chunks else mean_steps(name, train)

    return trips


def bound_on(estimate: RunEstimate, target: Target, precision: str = "float32") -> TargetBound:
    """`target`'s fit and roofline lower bound for `estimate` (module docstring). Clients are
    dealt over the target's devices (`--devices`); the data are replicated on each."""
    devices = target.devices
    peak = estimate.peak_bytes
    need = None
    if peak is not None:
        device_share = max(0, peak - estimate.data_bytes)
        if not estimate.store.startswith("device"):
            device_share = max(0, device_share - estimate.stored_bytes)
        need = estimate.data_bytes + device_share / devices
    matmul_rate = target.matmul_bf16 if precision == "bfloat16" else target.matmul_f32

    def seconds(cost: Cost) -> tuple[float, str]:
        parts = {"matmul": cost.matmul_flops / matmul_rate,
                 "vector": (cost.flops - cost.matmul_flops) / target.vector,
                 "memory": cost.bytes / target.bandwidth}
        limit = max(parts, key=parts.get)
        return parts[limit] / devices, limit

    round_seconds, limit = seconds(estimate.program("round").cost)
    run_seconds = sum(seconds(p.cost)[0] * p.calls for p in estimate.programs)
    occasional = estimate.occasional_round
    bound = TargetBound(target, need, None if need is None else need <= target.memory,
                        round_seconds, run_seconds, limit,
                        None if occasional is None else seconds(occasional)[0])
    compiled = next((c for c in estimate.compiled if c.target == target.name), None)
    return bound if compiled is None else compiled_bound(bound, compiled, estimate.config.rounds,
                                                         matmul_rate)


def compiled_bound(bound: TargetBound, compiled: CompiledRun, rounds: int,
                   matmul_rate: float) -> TargetBound:
    """`bound` with the TPU compiler's figures: its memory need and verdict, and the roofline
    recomputed from its per-device cost analysis (`CompiledProgram.per_device`). A run it
    refused keeps the datasheet's times (its programs were not all compiled)."""
    bound = bound._replace(need_bytes=compiled.need_bytes, fits=compiled.fits,
                           compiled=compiled)
    if compiled.refused is not None:
        return bound
    target = bound.target

    def seconds(cost: Cost) -> tuple[float, str]:  # one device's work: not divided again
        parts = {"matmul": cost.matmul_flops / matmul_rate,
                 "vector": (cost.flops - cost.matmul_flops) / target.vector,
                 "memory": cost.bytes / target.bandwidth}
        limit = max(parts, key=parts.get)
        return parts[limit], limit

    timed = [(p, *seconds(p.per_device())) for p in compiled.programs]
    in_rounds = [(p, t, limit) for p, t, limit in timed if p.kind == "round"]
    round_seconds = sum(t * p.calls for p, t, _ in in_rounds) / max(1, rounds)
    limit = max(in_rounds, key=lambda item: item[1] * item[0].calls)[2] if in_rounds \
        else bound.limit
    return bound._replace(round_seconds=round_seconds, limit=limit,
                          run_seconds=sum(t * p.calls for p, t, _ in timed))


def _tree_bytes(tree) -> int:
    return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize
                   for x in jax.tree.leaves(tree)))
