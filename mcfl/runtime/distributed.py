"""Runs over several processes (hosts): one program, the clients of every round dealt over the
devices of all of them.

Every process runs the same command with its own `process_id`. Each builds the same dataset
from the config and seed (nothing is sent between hosts but the collectives of the rounds),
joins the coordinator (`jax.distributed.initialize`), and runs the rounds on the mesh of every
process's devices (`mcfl.engine.client_mesh`): blocks of clients are dealt over all devices
and their sums all-reduced. The round's outputs are replicated on every device, so each
process holds the whole state; only process 0 writes the output folder.

On CPUs, the collectives go over gloo (JAX's default CPU collectives); on a TPU pod slice or
a GPU cluster, `jax.distributed.initialize()` without arguments finds its peers itself.
"""

from __future__ import annotations

from typing import Optional

import jax

from mcfl.errors import ConfigError


def initialize(coordinator: Optional[str], num_processes: Optional[int],
               process_id: Optional[int], timeout_seconds: int = 300) -> None:
    """Join a multi-process run before any other use of JAX. With no arguments, JAX finds the
    cluster itself (TPU pods, SLURM, ...); otherwise all three are needed."""
    given = [v is not None for v in (coordinator, num_processes, process_id)]
    if any(given) and not all(given):
        raise ConfigError("a multi-process run needs --coordinator HOST:PORT, --num-processes N "
                          "and --process-id I together")
    if all(given):
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise ConfigError(f"process id must be in [0, {num_processes}) for {num_processes} "
                              f"processes, got {process_id}")
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                   process_id=process_id, initialization_timeout=timeout_seconds)
    else:
        jax.distributed.initialize()


def process_count() -> int:
    return jax.process_count()


def is_leader() -> bool:
    """Whether this process writes results (process 0; the only one in a one-process run)."""
    return jax.process_index() == 0


def replicated_outputs(mesh) -> dict:
    """`jax.jit` keyword arguments that make every output replicated on `mesh` when the run
    spans several processes (a process can read back only what it holds); none otherwise."""
    if mesh is None or jax.process_count() == 1:
        return {}
    return {"out_shardings": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())}
