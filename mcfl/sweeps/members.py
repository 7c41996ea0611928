"""A sweep group's members as one program, in chunks that fit in memory.

Every member of a group shares the config up to its seed and the group's traced settings
(`mcfl.sweeps.spec`), so one `mcfl.runs.program.RoundProgram` with a member axis trains them all:
the algorithm is built once, and each member's hyperparameters are made inside the program
from its values of the traced settings; the member axis leads those values, the algorithm
state and the keys, while the dataset enters unbatched (one copy, shared). The rounds run in
the loop a single run uses (`mcfl.runs.loop`), so a member's rows equal its single run's to float
rounding (tests/test_sweeps.py).

Members run in chunks of `members_per_chunk`: the largest count whose compiled programs
(initialisation, rounds, evaluation) need, by XLA's memory analysis (arguments + outputs +
temporaries), at most the memory budget; the last chunk is padded with copies of its last
member so that every chunk reuses the same programs.

On several devices the member axis is dealt over them (`mcfl.runs.program.member_mesh`, a
`shard_map` over members): each device trains whole members, with no communication between
devices, and the chunk is a multiple of the device count. (Members of client-sharded runs, a
vmap over the engine's client `shard_map`, fail to transpose in JAX 0.10; members are the
natural unit to spread anyway, as they never exchange anything.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import jax
import jax.numpy as jnp

from mcfl.runs.execution import run_keys
from mcfl.runs.program import RoundProgram
from mcfl.runtime.memory import device_available
from mcfl.sweeps.spec import Member

# Share of the free memory a chunk's programs may use (the rest: the dataset's own arrays,
# host copies of metrics, fragmentation).
MEMORY_SHARE = 0.6


def default_width() -> Optional[int]:
    """Members side by side (vmapped) in a program: on CPU one, the others one after another
    in the same program (XLA:CPU runs a member's small matmuls no faster batched: 8 FedAvg
    members vmapped took 1.45x the time of 8 in sequence, and 1.5x the compile time); on
    GPU / TPU all (wide batches are what they are fast at)."""
    return 1 if jax.default_backend() == "cpu" else None


def memory_budget() -> int:
    """Bytes a chunk's programs may take: a share of the device's free memory (on CPU, of the
    host's available memory; `mcfl.runtime.memory`)."""
    return int(MEMORY_SHARE * device_available())


def member_keys(members: Sequence[Member]) -> tuple[jax.Array, jax.Array]:
    """[M] initialisation and rounds keys: each member's `run_keys(seed)`."""
    pairs = [run_keys(m.seed) for m in members]
    stack = lambda ks: jax.random.wrap_key_data(  # noqa: E731
        jnp.stack([jax.random.key_data(k) for k in ks]))
    return stack([p[0] for p in pairs]), stack([p[1] for p in pairs])


def padded(members: Sequence[Member], size: int) -> list[Member]:
    """`members` filled up to `size` with copies of the last (so every chunk has one shape)."""
    return list(members) + [members[-1]] * (size - len(members))


def compile_for(program: RoundProgram, members: Sequence[Member], data,
                size: int) -> Optional[int]:
    """Compile `program` for chunks of `size` members; their largest footprint in bytes."""
    probe = padded(members[:1], size)
    init_keys, rounds_keys = member_keys(probe)
    return program.compile(program.values([m.config for m in probe]), init_keys, rounds_keys,
                           data)


def fit(program: RoundProgram, members: Sequence[Member], data, budget: int, devices: int,
        most: Optional[int] = None) -> int:
    """Compile for the largest chunk (at most `most`, default every member; a multiple of
    the `devices`) whose programs fit in `budget` bytes; returns the chunk size."""
    whole = lambda n: -(-n // devices) * devices  # noqa: E731
    m = whole(min(len(members), most or len(members)))
    while True:
        need = compile_for(program, members, data, m)
        if need is None or need <= budget or m == devices:
            return m
        m = whole(max(1, min(m - devices, int(m * budget / need))))
