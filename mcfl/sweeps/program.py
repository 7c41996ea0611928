"""One sweep group as one compiled program: its members' runs vmapped over a member axis.

Every member of a group shares the config up to its seed and the group's traced settings
(`mcfl.sweeps.spec`). The algorithm is built once; its hyperparameters (`Hyperparams`) are made
inside the vmapped function from the member's values of the traced settings, so one program
trains every member: the member axis is a leading axis on those values, the algorithm state
and the keys, while the dataset enters unbatched (one copy, shared). Inside, a member's
computation is the one `mcfl.run` does for its config; a member's rows therefore equal its
single run's to float rounding (tests/test_sweeps.py).

Members run in chunks of `members_per_chunk`: the largest count whose compiled programs
(initialisation, rounds, evaluation) need, by XLA's memory analysis (arguments + outputs +
temporaries), at most the memory budget; the last chunk is padded with copies of its last
member so that every chunk reuses the same programs.

On several devices the member axis is dealt over them (`member_mesh`, a `shard_map` over
members): each device trains whole members, with no communication between devices, and the
chunk is a multiple of the device count. (Members of client-sharded runs, a vmap over the
engine's client `shard_map`, fail to transpose in JAX 0.10; members are the natural unit to
spread anyway, as they never exchange anything.)
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
import warnings
from collections.abc import Callable
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from mcfl.algorithms import build_algorithm, hyperparams
from mcfl.algorithms.base import scan_rounds
from mcfl.data import FederatedDataset
from mcfl.engine import planned_block_size
from mcfl.evaluation import aggregate, client_metrics
from mcfl.runner import (
    RunPlan,
    _evaluation_counts,
    _one_round,
    add_communication,
    cluster_metrics,
    round_chunks,
    run_keys,
)
from mcfl.sweeps.spec import Group, Member

MEMBER_AXIS = "members"

def default_width() -> Optional[int]:
    """Members side by side (vmapped) in a program: on CPU one, the others one after another
    in the same program (XLA:CPU runs a member's small matmuls no faster batched: 8 FedAvg
    members vmapped took 1.45x the time of 8 in sequence, and 1.5x the compile time); on
    GPU / TPU all (wide batches are what they are fast at)."""
    return 1 if jax.default_backend() == "cpu" else None


# Share of the free memory a chunk's programs may use (the rest: the dataset's own arrays,
# host copies of metrics, fragmentation).
MEMORY_SHARE = 0.6


def memory_budget() -> int:
    """Bytes a chunk's programs may take: a share of the accelerator's free memory, or on CPU
    of the host's available memory."""
    stats = getattr(jax.devices()[0], "memory_stats", lambda: None)()
    if stats and "bytes_limit" in stats:
        return int(MEMORY_SHARE * (stats["bytes_limit"] - stats.get("bytes_in_use", 0)))
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return int(MEMORY_SHARE * info["MemAvailable"])
    except (OSError, KeyError, ValueError):
        return int(MEMORY_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


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


def member_keys(members: list[Member]) -> tuple[jax.Array, jax.Array]:
    """[M] initialisation and rounds keys: each member's `run_keys(seed)`."""
    pairs = [run_keys(m.seed) for m in members]
    stack = lambda ks: jax.random.wrap_key_data(  # noqa: E731
        jnp.stack([jax.random.key_data(k) for k in ks]))
    return stack([p[0] for p in pairs]), stack([p[1] for p in pairs])


@dataclasses.dataclass
class MemberRun:
    """A member's rows (as its single run's rounds.csv has them) and how it ended."""

    member: Member
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    status: str = "completed"
    comm_total: int = 0


class GroupProgram:
    """The compiled programs of one group, for chunks of `members_per_chunk` members."""

    def __init__(self, group: Group, plan: RunPlan,
                 mesh: Optional[jax.sharding.Mesh] = None, width: Optional[int] = None):
        self.group, self.plan, self.mesh = group, plan, mesh
        self.devices = 1 if mesh is None else mesh.size
        base = group.base
        self.block = min(plan.block_size, plan.clients_per_round)
        algorithm = build_algorithm(base, plan.model, plan.clients_per_round)

        def hp(values):
            return hyperparams(base, plan.model, values)

        self.clustered = algorithm.assignments is not None
        self.scanned = base.scan_rounds

        def init(values, init_key, data):
            return algorithm.init(data, init_key, hp(values))

        def evaluate(values, state, data):
            del values
            counts = _evaluation_counts(algorithm, plan.model.apply, plan.eval_block, state,
                                        data)
            assigned = algorithm.assignments(state) if self.clustered else None
            return counts, assigned

        def rounds(count, values, state, data, rounds_key, first):
            if self.scanned:
                return scan_rounds(algorithm, hp(values), state, data, rounds_key, first, count)
            return _one_round(algorithm, hp(values), state, data, rounds_key, first)

        self._init = jax.jit(over_members(init, (True, True, False), mesh, width))
        self._evaluate = jax.jit(over_members(evaluate, (True, True, False), mesh, width))
        self._rounds = {}
        for _, count in round_chunks(base.rounds, base.eval_every, self.scanned):
            if count not in self._rounds:
                self._rounds[count] = jax.jit(
                    over_members(functools.partial(rounds, count),
                                 (True, True, False, True, False), mesh, width),
                    donate_argnums=(1,))
        self._compiled: dict[str, Any] = {}
        self.members_per_chunk = 0
        self.compile_seconds = 0.0
        self.init_seconds = 0.0  # the members' initialisations (FeSEM's k-means, cold starts)

    def _values(self, members: list[Member]) -> dict[str, jax.Array]:
        return {k: jnp.asarray([getattr(m.config, k) for m in members], jnp.float32)
                for k in self.group.traced}

    def compile(self, data, members_per_chunk: int) -> Optional[int]:
        """Compile every program for chunks of `members_per_chunk`; their largest footprint
        in bytes (None when the backend cannot say)."""
        with planned_block_size(self.block):
            return self._compile(data, members_per_chunk)

    def _compile(self, data, members_per_chunk: int) -> Optional[int]:
        start = time.perf_counter()
        probe = list(self.group.members[:1]) * members_per_chunk
        values = self._values(probe)
        init_keys, rounds_keys = member_keys(probe)
        lowered = {"init": self._init.lower(values, init_keys, data)}
        state = jax.eval_shape(self._init, values, init_keys, data)
        first = jnp.asarray(1, jnp.int32)
        for count, fn in self._rounds.items():
            lowered[f"rounds{count}"] = fn.lower(values, state, data, rounds_keys, first)
        lowered["evaluate"] = self._evaluate.lower(values, state, data)
        compiled = {name: lo.compile() for name, lo in lowered.items()}
        self._compiled = compiled
        self.members_per_chunk = members_per_chunk
        self.compile_seconds += time.perf_counter() - start
        sizes = [footprint(c) for c in compiled.values()]
        return None if None in sizes else max(sizes)

    def fit(self, data, budget: int, most: Optional[int] = None) -> int:
        """Compile for the largest chunk (at most `most`, default every member) whose
        programs fit in `budget` bytes; returns the chunk size."""
        d = self.devices
        whole = lambda n: -(-n // d) * d  # noqa: E731  (a multiple of the devices)
        m = whole(min(len(self.group.members), most or len(self.group.members)))
        while True:
            need = self.compile(data, m)
            if need is None or need <= budget or m == d:
                return m
            m = whole(max(1, min(m - d, int(m * budget / need))))

    def run_chunk(self, members: list[Member], dataset: FederatedDataset,
                  on_rounds: Callable[[int], None] = lambda n: None) -> list[MemberRun]:
        """Train `members` (at most `members_per_chunk`) through every round."""
        size = self.members_per_chunk
        padded = members + [members[-1]] * (size - len(members))
        data = dataset.arrays
        values = self._values(padded)
        init_keys, rounds_keys = member_keys(padded)
        runs = [MemberRun(m) for m in members]
        base = self.group.base
        t0 = time.perf_counter()
        # waited for here, or its time would be counted in the first round's seconds
        state = jax.block_until_ready(self._compiled["init"](values, init_keys, data))
        self.init_seconds += time.perf_counter() - t0
        for first, count in round_chunks(base.rounds, base.eval_every, self.scanned):
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
                state, metrics = self._compiled[f"rounds{count}"](
                    values, state, data, rounds_keys, jnp.asarray(first, jnp.int32))
            metrics = jax.device_get(metrics)  # {name: [members, count]}
            seconds = (time.perf_counter() - t0) / count
            last = first + count - 1
            evaluated = last % base.eval_every == 0 or last == base.rounds
            if evaluated:
                (counts, test_counts), assigned = jax.device_get(
                    self._compiled["evaluate"](values, state, data))
            for i, run in enumerate(runs):
                for j in range(count):
                    if run.status != "completed":
                        break
                    r = first + j
                    row = {"round": r, **{k: float(v[i, j]) for k, v in metrics.items()},
                           "seconds": seconds}
                    if not all(np.isfinite(v) for v in row.values()):
                        run.status = "diverged"  # its rows so far are kept, like a run's
                        break
                    run.comm_total += add_communication(row, self.plan.params_count,
                                                        run.comm_total)
                    if evaluated and j == count - 1:
                        own = jax.tree.map(lambda a, i=i: a[i], counts)
                        row.update(aggregate(client_metrics(own, np.asarray(test_counts[i]))))
                        if self.clustered:
                            row.update(cluster_metrics(np.asarray(assigned[i]),
                                                       dataset.true_cluster))
                    run.rows.append(row)
            on_rounds(count)
        return runs
