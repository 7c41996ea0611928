"""Which model serves a client that never trained, from its unlabelled rows.

A clustered-FL benchmark scores clients that arrive at test time without labels (FLUX,
Fenoglio et al., NeurIPS 2025, Sec. "test phase"): each must be given one of the trained
models before any of its labels is seen. FLUX matches a descriptor of the client's features to
its clusters' centroids (its own rule, `mcfl.algorithms.clustered.flux`); for every other algorithm
the rule here is the usual label-free one of test-time model selection: the candidate whose
predictions on the client's training rows are the most confident, i.e. of the lowest mean
predictive entropy ``H(p) = -sum_k p_k log p_k`` (the entropy criterion of test-time
adaptation, Wang et al., ICLR 2021, "Tent"). The labels are never read.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from mcfl.data.federated import FederatedData
from mcfl.engine.client_data import CLIENT_ROWS_CHUNK, sums_over_client_rows
from mcfl.engine.training import ApplyFn, PyTree


def prediction_entropies(apply_fn: ApplyFn, data: FederatedData, models: PyTree,
                         clients: jax.Array, block_size: Optional[int] = None,
                         chunk: int = CLIENT_ROWS_CHUNK) -> jax.Array:
    """[S, M] mean predictive entropy (nats) of each of the M stacked `models` on each client's
    training rows; the labels are not read."""
    def per_chunk(x, y, mask, inp):
        del y, inp  # label-free
        logits = jax.vmap(lambda params: apply_fn(params, x))(models)  # [M, chunk, K]
        log_p = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        entropy = -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)  # [M, chunk]
        return jnp.sum(entropy * mask, axis=1)

    num_models = jax.tree.leaves(models)[0].shape[0]
    totals = sums_over_client_rows(data, clients, models, per_chunk,
                                   jnp.zeros((num_models,), jnp.float32), chunk=chunk,
                                   block_size=block_size)
    return totals / jnp.maximum(data.train_counts[clients], 1)[:, None]


def most_confident(apply_fn: ApplyFn, data: FederatedData, models: PyTree,
                   block_size: Optional[int] = None) -> jax.Array:
    """[C] for every client of `data`, the index of the model of lowest mean predictive entropy
    on its training rows (ties: the lowest index); 0 for all when there is one model."""
    if jax.tree.leaves(models)[0].shape[0] == 1:
        return jnp.zeros((data.num_clients,), jnp.int32)
    clients = jnp.arange(data.num_clients, dtype=jnp.int32)
    entropies = prediction_entropies(apply_fn, data, models, clients, block_size)
    return jnp.argmin(entropies, axis=1).astype(jnp.int32)
