"""Which client store a run uses, and why (`--client-store auto|device|host|disk`).

What is stored: an algorithm's per-client rows (`ClientRows`: Local's models), or the
clients' trained models of a population start (`PopulationStart`: FeSEM's and Robust's),
[members x clients] of them. `auto` keeps them on the device when they take at most half its
free memory (the rest is room for training), else in host memory when they take at most half
of what the host has free (an accelerator's host), else on disk. On CPU the device's memory
is the host's, so `auto` goes from device straight to disk.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from mcfl.algorithms.framework.stored import to_storage
from mcfl.runtime import memory

# The share of free memory stored rows may take on the device or the host.
FIT_SHARE = 0.5


class StoreChoice(NamedTuple):
    kind: str  # device | host | disk
    reason: str
    stored_bytes: int  # what the store holds (0: nothing per client)


def stored_bytes(algorithm, name: str, hp, data, members: int) -> tuple[int, str]:
    """Bytes of what `algorithm` (registered as `name`) keeps per client over the population,
    and what it is."""
    num_clients = int(data.num_clients)
    one = jax.ShapeDtypeStruct((1,), jnp.int32)
    client_state = algorithm.client_state
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
    if algorithm.rows:
        # (the data as an argument: shapes are all it needs of them)
        state = jax.eval_shape(lambda d, k: algorithm.init(d, k, hp), data, key)
        row = jax.eval_shape(lambda s: to_storage(client_state.fresh(
            s, jnp.zeros((1,), jnp.int32)), client_state.dtype), state)
        per_client = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(row))
        what = f"{name}'s per-client state"
    elif client_state is not None and client_state.start is not None:
        points = jax.eval_shape(lambda d, k, c: client_state.start.points(d, k, hp, c), data,
                                key, one)
        per_client = (2 if client_state.dtype == "bfloat16" else 4) * int(points.shape[1])
        what = f"{name}'s start (every client's trained model)"
    else:
        return 0, f"{name} keeps nothing per client"
    return per_client * num_clients * members, what


def choose_store(setting: str, algorithm, name: str, hp, data, members: int = 1,
                 accelerator_free: Optional[int] = None) -> StoreChoice:
    """The store `setting` gives for `algorithm` (registered as `name`) on `data` (see the
    module docstring). `accelerator_free`: the free bytes of an accelerator the run is
    planned for (`mcfl plan`'s TPU targets) instead of this machine's device; its host's
    memory is not known from here, so rows over half of it go to a host store."""
    need, what = stored_bytes(algorithm, name, hp, data, members)
    size = f"{what}: {need / 2**30:.2f} GiB"
    if need == 0:
        return StoreChoice("device", what, 0)
    if setting != "auto":
        return StoreChoice(setting, f"{size}, as asked", need)
    if accelerator_free is not None:
        if need <= FIT_SHARE * accelerator_free:
            return StoreChoice("device", f"{size}, at most half the accelerator's "
                               f"{accelerator_free / 2**30:.2f} GiB", need)
        return StoreChoice("host", f"{size}, more than half the accelerator's "
                           f"{accelerator_free / 2**30:.2f} GiB", need)
    device_free = memory.device_available()
    if need <= FIT_SHARE * device_free:
        return StoreChoice("device", f"{size}, at most half the device's "
                           f"{device_free / 2**30:.1f} GiB free", need)
    if not memory.on_host():
        host_free = memory.host_available()
        if need <= FIT_SHARE * host_free:
            return StoreChoice("host", f"{size}, more than half the device's "
                               f"{device_free / 2**30:.1f} GiB free; at most half the host's "
                               f"{host_free / 2**30:.1f} GiB", need)
    return StoreChoice("disk", f"{size}, more than half the "
                       f"{device_free / 2**30:.1f} GiB of memory free", need)
