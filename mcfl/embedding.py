"""Client models in two dimensions, for FeSEM's Fig. 3-style plot (`mcfl plot clusters`).

After a clustered run, a sample of clients each train once (one round of local training, no
aggregation) from the model the algorithm evaluates them with (their cluster's); their
flattened models are centred and projected on the top two principal directions (a truncated
SVD through the n x n Gram matrix, so no d x d matrix is formed).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from mcfl import memory
from mcfl.algorithms.base import FederatedAlgorithm
from mcfl.algorithms.clustered import flat_models
from mcfl.clustering import truncated_svd
from mcfl.engine import LocalTraining, RoundClients, train_and_collect
from mcfl.sampling import sample_clients

# The sampled clients' models are held three times (trained, flattened, centred), in float32:
# at most this share of the free memory (`embedding_count`).
MEMORY_SHARE = 0.25


def embedding_count(wanted: int, num_clients: int, params_count: int) -> int:
    """How many clients the embedding samples: `wanted` (at most every client), fewer when
    their models would take more than `MEMORY_SHARE` of the device's free memory (the models
    a disk store keeps, 1,000 of LEAF's FEMNIST CNN, are 26 GB each time)."""
    fits = int(MEMORY_SHARE * memory.device_available()) // max(12 * params_count, 1)
    return max(1, min(wanted, num_clients, fits))


class ClientEmbedding(NamedTuple):
    clients: jax.Array  # [n] int32 client indices, ascending
    coords: jax.Array  # [n, 2] principal components of their local models
    explained: jax.Array  # [2] share of the variance each component explains


def client_embedding(algorithm: FederatedAlgorithm, training: LocalTraining, num_clients: int,
                     state, data, key) -> ClientEmbedding:
    """The 2-D PCA projection of `num_clients` sampled clients' local models, each trained once
    from the model `algorithm` evaluates it with (jittable, `num_clients` static)."""
    models, index = algorithm.client_models(state)
    if algorithm.view is not None:
        data = algorithm.view(state, data)
    if index is None:
        index = jnp.zeros((data.num_clients,), jnp.int32)
    sample_key, train_key = jax.random.split(key)
    clients = jnp.sort(sample_clients(sample_key, data.num_clients, num_clients))
    trained, _ = train_and_collect(training, data, train_key, models,
                                   RoundClients(clients, index[clients]))
    flat = flat_models(trained)
    centred = flat - jnp.mean(flat, axis=0, keepdims=True)
    u, s, _ = truncated_svd(centred, 2)
    total = jnp.maximum(jnp.sum(jnp.square(centred)), 1e-30)
    return ClientEmbedding(clients, u * s[None, :], jnp.square(s) / total)
