"""Which client store a run uses, and why (`--client-store auto|device|host|disk`).

What is stored: an algorithm's per-client rows (`ClientRows`: Local's models), or the
clients' trained models of a population start (`PopulationStart`: FeSEM's and Robust's),
[members x clients] of them. `auto` keeps them on the device when they take at most half its
free memory (the rest is room for training), else in host memory when they take at most half
of what the host has free (an accelerator's host), else on disk. On CPU the device's memory
is the host's, so `auto` goes from device straight to disk.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mcfl import memory
from mcfl.algorithms.stored import to_storage
from mcfl.errors import ConfigError

# The share of free memory stored rows may take on the device or the host.
FIT_SHARE = 0.5


class StoreChoice(NamedTuple):
    kind: str  # device | host | disk
    reason: str
    stored_bytes: int  # what the store holds (0: nothing per client)


def stored_bytes(algorithm, hp, data, members: int) -> tuple[int, str]:
    """Bytes of what `algorithm` keeps per client over the population, and what it is."""
    num_clients = int(data.num_clients)
    one = jax.ShapeDtypeStruct((1,), jnp.int32)
    if algorithm.client_rows is not None:
        rows = algorithm.client_rows
        key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
        shared = jax.eval_shape(lambda k: rows.init_shared(data, k, hp), key)
        row = jax.eval_shape(lambda s: to_storage(rows.fresh(s, jnp.zeros((1,), jnp.int32)),
                                                  algorithm.store_dtype), shared)
        per_client = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(row))
        what = f"{algorithm.name}'s per-client state"
    elif algorithm.population_start is not None:
        key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
        points = jax.eval_shape(lambda k, c: algorithm.population_start.points(data, k, hp, c),
                                key, one)
        per_client = (2 if algorithm.store_dtype == "bfloat16" else 4) * int(points.shape[1])
        what = f"{algorithm.name}'s start (every client's trained model)"
    else:
        return 0, f"{algorithm.name} keeps nothing per client"
    return per_client * num_clients * members, what


def choose_store(setting: str, algorithm, hp, data, members: int = 1,
                 stateful_name: str = "") -> StoreChoice:
    """The store `setting` gives for `algorithm` on `data` (see the module docstring)."""
    need, what = stored_bytes(algorithm, hp, data, members)
    size = f"{what}: {need / 2**30:.2f} GiB"
    if need == 0:
        if setting in ("host", "disk") and stateful_name:
            raise ConfigError(
                f"client_store={setting!r}: {stateful_name} with this run's wrappers (a "
                f"distribution shift, a client schedule or bn=local) keeps its client state "
                f"on the device; use client_store='device' or 'auto'")
        return StoreChoice("device", what, 0)
    if setting != "auto":
        return StoreChoice(setting, f"{size}, as asked", need)
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
