"""Which rows a client's local step reads: the one definition shared by the per-client
engine (`mcfl.engine.local_train`), the factored path (`mcfl.engine.lowrank`) and the tests'
reference loop.

Client i's epoch e visits its rows in the order of a permutation (`mcfl.engine.permutation`)
whose round keys are derived from e and the client's shuffle keys, one threefry draw from
``fold_in(round_key, i)`` made once per client and round (`client_shuffle_keys`), computed only
at the positions a step reads: a round costs what its clients' batches cost, not a shuffle of
the population, and a client's batches depend on its own key only (not on the other clients,
the blocking or the sampling).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mcfl.engine.permutation import derived_round_keys, permute_keyed, round_keys


def client_shuffle_keys(round_key: jax.Array, client) -> jax.Array:
    """The [ROUNDS] uint32 keys from which client `client`'s epochs of a round derive their
    shuffles (compute once per client and round, outside the loop over steps)."""
    return round_keys(jax.random.fold_in(round_key, client))


def step_rows(round_key: jax.Array, data, client, step, batch: int):
    """Rows [batch] that step `step` of client `client` reads, and the mask of the real ones
    (`step_rows_keyed` with the client's keys derived here)."""
    return step_rows_keyed(client_shuffle_keys(round_key, client), data, client, step, batch)


def step_rows_keyed(shuffle_keys: jax.Array, data, client, step, batch: int):
    """Rows [batch] that step `step` of client `client` reads, and the mask of the real ones,
    for the client's `client_shuffle_keys`.

    Step s reads batch ``s % ceil(n/B)`` of epoch ``s // ceil(n/B)`` (n the client's rows): the
    positions ``b B .. b B + B - 1`` of that epoch's permutation of ``[0, n)``, mapped through
    the client's rows ``order[offset + position]``. An epoch's last batch is partial: its missing
    positions repeat the last one, masked out.
    """
    offset, count = data.train_offsets[client], data.train_counts[client]
    steps_per_epoch = jnp.maximum((count + batch - 1) // batch, 1)
    epoch = step // steps_per_epoch
    pos = (step % steps_per_epoch) * batch + jnp.arange(batch, dtype=jnp.int32)
    valid = pos < count
    pos = jnp.minimum(pos, jnp.maximum(count - 1, 0))
    shuffled = permute_keyed(derived_round_keys(shuffle_keys, epoch), count, pos)
    return data.train_order[offset + shuffled], valid


def epoch_positions(round_key: jax.Array, client, epoch, count) -> jax.Array:
    """[count] the whole of client `client`'s epoch-`epoch` order, as positions in
    ``[0, count)`` (for tests and inspection; training computes only what it reads)."""
    keys = derived_round_keys(client_shuffle_keys(round_key, client), epoch)
    return permute_keyed(keys, count, jnp.arange(int(count), dtype=jnp.int32))
