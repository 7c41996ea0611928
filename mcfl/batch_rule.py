"""Which rows a client's local step reads: the one definition shared by the per-client engine
(`mcfl.engine.local_train`) and the factored path (`mcfl.lowrank`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def step_rows(orders: jax.Array, offset, count, step, batch: int):
    """Rows [batch] of step `step` of the client whose ``count`` rows start at ``offset`` in
    the epoch orders [E, N], and the mask of the real ones. Step s reads batch
    ``s % ceil(n/B)`` of epoch ``s // ceil(n/B)`` (the last epoch's order is reused past the
    end); an epoch's last batch is partial, its missing rows repeat the client's last row,
    masked."""
    steps_per_epoch = jnp.maximum((count + batch - 1) // batch, 1)
    epoch = jnp.minimum(step // steps_per_epoch, orders.shape[0] - 1)
    pos = (step % steps_per_epoch) * batch + jnp.arange(batch, dtype=jnp.int32)
    rows = orders[epoch, offset + jnp.minimum(pos, jnp.maximum(count - 1, 0))]
    return rows, pos < count
