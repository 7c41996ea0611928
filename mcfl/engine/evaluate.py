"""Evaluation counts: every client on its own test (or training) rows with the model its
algorithm gives it, as per-client sums from which accuracy and F1 follow on the host
(`mcfl.runs.evaluation`). Linear in the rows."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from mcfl.data.federated import FederatedData
from mcfl.engine.blocks import by_length, map_blocks, map_clients
from mcfl.engine.client_data import CLIENT_ROWS_CHUNK, chunk_rows
from mcfl.engine.training import ApplyFn, PyTree, ceil_div

DEFAULT_EVAL_BATCH = 256


class EvalCounts(NamedTuple):
    """Per-client test counts, from which accuracy and F1 follow (all on the host)."""

    loss_sum: jax.Array  # [C]
    correct: jax.Array  # [C]
    true_pos: jax.Array  # [C, num_classes]
    false_pos: jax.Array  # [C, num_classes]
    false_neg: jax.Array  # [C, num_classes]


# Models shared by many clients (one global model, K clusters) are evaluated row chunk by row
# chunk, each chunk holding rows of one model; above this many models (Local: one per client)
# each client is evaluated with its own model instead.
MAX_SHARED_EVAL_MODELS = 64


def evaluate_counts(
    apply_fn: ApplyFn,
    data: FederatedData,
    models: PyTree,
    model_index: jax.Array,
    block_size: int,
    eval_batch: int = DEFAULT_EVAL_BATCH,
    split: str = "test",
) -> EvalCounts:
    """Evaluate every client on its own `split` rows with ``models[model_index[i]]``.

    The work is linear in the split's rows: with at most `MAX_SHARED_EVAL_MODELS` models the
    rows are grouped by their client's model and cut into chunks of `eval_batch` rows of one
    model each (at most N / eval_batch + M chunks); otherwise clients are evaluated one model
    each, in blocks of clients with similar row counts and chunks of at most
    `CLIENT_ROWS_CHUNK` of a client's rows.
    """
    num_models = jax.tree.leaves(models)[0].shape[0]
    if num_models <= MAX_SHARED_EVAL_MODELS:
        return _evaluate_by_model(apply_fn, data, models, model_index, block_size, eval_batch,
                                  split)
    return _evaluate_by_client(apply_fn, data, models, model_index, block_size,
                               min(eval_batch, CLIENT_ROWS_CHUNK), split)


def _split_arrays(data: FederatedData, split: str):
    if split == "test":
        return (data.x_test, data.y_test, data.test_owner, data.test_offsets, data.test_counts,
                data.test_order)
    return (data.x_train, data.y_train, data.train_owner, data.train_offsets, data.train_counts,
            data.train_order)


def _counts_from_rows(owner, labels, pred, loss, valid, num_clients: int, num_classes: int):
    """Per-client EvalCounts from per-row predictions (rows of owner C, nobody, and invalid
    rows are left out): scatter-adds, linear in the rows."""
    owner = jnp.where(valid, owner, num_clients)  # row C of the sums is dropped
    hit = (pred == labels) & valid
    size = (num_clients + 1, num_classes)
    per_class = lambda cls, w: jnp.zeros(size, jnp.float32).at[owner, cls].add(w)[:-1]  # noqa: E731
    tp = per_class(labels, hit.astype(jnp.float32))
    predicted = per_class(pred, valid.astype(jnp.float32))
    actual = per_class(labels, valid.astype(jnp.float32))
    per_client = lambda w: jnp.zeros((num_clients + 1,), jnp.float32).at[owner].add(w)[:-1]  # noqa: E731
    return EvalCounts(
        loss_sum=per_client(jnp.where(valid, loss, 0.0)),
        correct=per_client(hit.astype(jnp.float32)),
        true_pos=tp,
        false_pos=predicted - tp,
        false_neg=actual - tp,
    )


def _evaluate_by_model(apply_fn, data, models, model_index, block_size, chunk, split):
    x, y, owner, _, _, _ = _split_arrays(data, split)
    num_rows, c = y.shape[0], data.num_clients
    num_models = jax.tree.leaves(models)[0].shape[0]
    held = owner < c
    row_model = jnp.where(held, model_index[jnp.minimum(owner, c - 1)], num_models)
    by_model = jnp.argsort(row_model, stable=True).astype(jnp.int32)  # rows of model m together
    rows_per_model = jnp.zeros((num_models + 1,), jnp.int32).at[row_model].add(1)[:num_models]
    chunks_per_model = ceil_div(rows_per_model, chunk)
    chunk_end = jnp.cumsum(chunks_per_model)  # [M] chunks up to and including model m
    row_start = jnp.cumsum(rows_per_model) - rows_per_model
    num_chunks = num_rows // chunk + num_models + 1  # static bound on the chunks needed
    j = jnp.arange(num_chunks, dtype=jnp.int32)
    model_of = jnp.minimum(jnp.searchsorted(chunk_end, j, side="right"), num_models - 1)
    local = j - (chunk_end[model_of] - chunks_per_model[model_of])
    inputs = {
        "model": model_of.astype(jnp.int32),
        "start": row_start[model_of] + local * chunk,
        "count": jnp.clip(rows_per_model[model_of] - local * chunk, 0, chunk),
    }

    def one_chunk(inp):
        params = jax.tree.map(lambda m: m[inp["model"]], models)
        positions = inp["start"] + jnp.arange(chunk, dtype=jnp.int32)
        rows = by_model[jnp.minimum(positions, num_rows - 1)]
        logits = apply_fn(params, x[rows])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y[rows])
        valid = jnp.arange(chunk) < inp["count"]
        return rows, jnp.argmax(logits, -1).astype(jnp.int32), loss, valid

    rows, pred, loss, valid = map_blocks(jax.vmap(one_chunk), inputs, block_size)
    rows, pred, loss, valid = (a.reshape(-1) for a in (rows, pred, loss, valid))
    return _counts_from_rows(owner[rows], y[rows], pred, loss, valid, c, data.num_classes)


def evaluate_clients(
    apply_fn: ApplyFn,
    data: FederatedData,
    models: PyTree,
    clients: jax.Array,
    block_size: int,
    eval_batch: int = DEFAULT_EVAL_BATCH,
    split: str = "test",
) -> EvalCounts:
    """[b] counts of the clients `clients` [b], client ``clients[j]`` on its own `split` rows
    with its own model ``models[j]`` (a block of clients whose models a client store holds)."""
    index = jnp.arange(clients.shape[0], dtype=jnp.int32)
    return _evaluate_by_client(apply_fn, data, models, index, block_size,
                               min(eval_batch, CLIENT_ROWS_CHUNK), split, clients)


def _evaluate_by_client(apply_fn, data, models, model_index, block_size, eval_batch, split,
                        clients=None):
    x, y, _, offsets, counts, order = _split_arrays(data, split)
    nc = data.num_classes

    def one_client(inp, loop_length, alone):
        del alone  # rows past the client's end are masked in every chunk anyway
        params = jax.tree.map(lambda m: m[inp["model"]], models)
        offset, count = offsets[inp["client"]], counts[inp["client"]]

        def body(i, acc):
            positions, mask = chunk_rows(i, eval_batch, offset, count)
            rows = order[positions]
            logits = apply_fn(params, x[rows])
            labels = y[rows]
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
            pred = jax.nn.one_hot(jnp.argmax(logits, -1), nc) * mask[:, None]
            true = jax.nn.one_hot(labels, nc) * mask[:, None]
            tp = jnp.sum(pred * true, 0)
            return EvalCounts(
                acc.loss_sum + jnp.sum(losses * mask),
                acc.correct + jnp.sum(tp),
                acc.true_pos + tp,
                acc.false_pos + jnp.sum(pred, 0) - tp,
                acc.false_neg + jnp.sum(true, 0) - tp,
            )

        zero = jnp.zeros((), jnp.float32)
        zeros = jnp.zeros((nc,), jnp.float32)
        return jax.lax.fori_loop(0, loop_length, body, EvalCounts(zero, zero, zeros, zeros, zeros))

    if clients is None:
        clients = jnp.arange(data.num_clients, dtype=jnp.int32)
    inputs = {
        "client": clients,
        "model": model_index.astype(jnp.int32),
        "eval_chunks": ceil_div(counts[clients], eval_batch),
    }
    return map_clients(by_length(one_client, "eval_chunks"), inputs, inputs["eval_chunks"],
                       block_size)
