"""Loops over ONE client's rows in fixed chunks: full-batch gradients (FedSGD, FedDANE), sums
of per-row quantities over each client's training rows (IFCA's losses, FedEM's posteriors,
FedSoft's nearest centers), and evaluation with models of their own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import jax
import jax.numpy as jnp
import optax

from mcfl.data.federated import FederatedData
from mcfl.engine.blocks import block_size_for, by_length, map_clients
from mcfl.engine.training import ApplyFn, PyTree, ceil_div

# Rows per step of the loops over ONE client's rows (IFCA's losses, FedSGD / FedDANE gradients,
# evaluating clients with models of their own). A client's last chunk is padded to full size,
# so the chunk should be small against a typical client: FlexCFL's FashionMNIST clients hold a
# median of 83 training rows, and IFCA's 5-model losses of 20 of them took 10.1 s a round in
# chunks of 256, 4.3 s in chunks of 64 and 4.5 s in chunks of 16 (2-core AMD EPYC); MCLR on
# Synthetic: 8 ms either way.
CLIENT_ROWS_CHUNK = 64


def chunk_rows(i, chunk: int, offset, count) -> tuple[jax.Array, jax.Array]:
    """Positions [chunk] (in the owner-sorted row order) of the i-th chunk of a client's
    ``count`` rows starting at ``offset``, and the mask of the real ones (past the end, the last
    position is repeated and masked out)."""
    pos = i * chunk + jnp.arange(chunk, dtype=jnp.int32)
    return offset + jnp.minimum(pos, jnp.maximum(count - 1, 0)), pos < count


def row_losses(apply_fn: ApplyFn, models: PyTree, x, y) -> jax.Array:
    """[K, B] cross-entropy of each of the K stacked `models` on each row."""
    return jax.vmap(lambda params: optax.softmax_cross_entropy_with_integer_labels(
        apply_fn(params, x), y))(models)


def sums_over_client_rows(data: FederatedData, clients: jax.Array, models: PyTree,
                          per_chunk: Callable, zeros: PyTree, inputs: Optional[dict] = None,
                          chunk: int = CLIENT_ROWS_CHUNK,
                          block_size: Optional[int] = None) -> PyTree:
    """[S, ...] for each of `clients`, the sum over its training rows, `chunk` rows at a time,
    of ``per_chunk(x [chunk, ...], y [chunk], mask [chunk], inp) -> like zeros`` (`mask`:
    the client's real rows; `inp`: the client's entries of `inputs` [S, ...]). `models`, the
    stacked models each chunk reads, sizes the blocks of clients run side by side."""
    def one_client(inp, loop_length, alone):
        del alone  # rows past the client's end are masked in every chunk anyway
        offset, count = data.train_offsets[inp["client"]], data.train_counts[inp["client"]]

        def body(i, total):
            positions, mask = chunk_rows(i, chunk, offset, count)
            rows = data.train_order[positions]
            found = per_chunk(data.x_train[rows], data.y_train[rows], mask, inp)
            return jax.tree.map(jnp.add, total, found)

        return jax.lax.fori_loop(0, loop_length, body, zeros)

    every = {**(inputs or {}), "client": clients,
             "chunks": ceil_div(data.train_counts[clients], chunk)}
    block_size = block_size_for(models, clients.shape[0], block_size)
    return map_clients(by_length(one_client, "chunks"), every, every["chunks"], block_size)


def full_gradient(
    apply_fn: ApplyFn,
    data: FederatedData,
    params: PyTree,
    offset: jax.Array,
    count: jax.Array,
    chunk: int,
    loop_length: jax.Array,
) -> tuple[PyTree, jax.Array]:
    """Gradient and value of one client's mean training loss over all its rows (FedSGD),
    accumulated over chunks of `chunk` rows so memory does not grow with the client."""
    def summed_loss(p, xb, yb, mask):
        losses = optax.softmax_cross_entropy_with_integer_labels(apply_fn(p, xb), yb)
        return jnp.sum(losses * mask)

    def body(i, carry):
        grad_sum, loss_sum = carry
        positions, mask = chunk_rows(i, chunk, offset, count)
        rows = data.train_order[positions]
        loss, grad = jax.value_and_grad(summed_loss)(
            params, data.x_train[rows], data.y_train[rows], mask
        )
        return jax.tree.map(jnp.add, grad_sum, grad), loss_sum + loss

    zeros = jax.tree.map(jnp.zeros_like, params)
    grad_sum, loss_sum = jax.lax.fori_loop(
        0, loop_length, body, (zeros, jnp.zeros((), jnp.float32))
    )
    n = jnp.maximum(count, 1).astype(jnp.float32)
    return jax.tree.map(lambda g: g / n, grad_sum), loss_sum / n


def gradient_of_client(apply_fn: ApplyFn, data: FederatedData, start_models: PyTree,
                       chunk: int = CLIENT_ROWS_CHUNK):
    """``one_client(inp, loop_length, alone)`` for `blocks.by_length`: the full-batch gradient
    and mean loss of client ``inp["client"]`` at ``start_models[inp["start"]]``, over
    ``inp["chunks"]`` chunks of `chunk` rows."""
    def one_client(inp, loop_length, alone):
        del alone  # rows past the client's end are masked in every chunk anyway
        params = jax.tree.map(lambda m: m[inp["start"]], start_models)
        return full_gradient(apply_fn, data, params, data.train_offsets[inp["client"]],
                             data.train_counts[inp["client"]], chunk, loop_length)

    return one_client
