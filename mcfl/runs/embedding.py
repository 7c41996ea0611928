"""Client models in two dimensions, for FeSEM's Fig. 3-style plot (`mcfl plot clusters`).

After a clustered run, a sample of clients each train once (one round of local training, no
aggregation) from the model the algorithm evaluates them with (their cluster's); their
flattened models are centred and projected on the top two principal directions (a truncated
SVD through the n x n Gram matrix, so no d x d matrix is formed).

The n sampled models are [n, d] floats, held three times over (trained, flattened, centred)
by the one-program path: 26 GB each for 1,000 of LEAF's FEMNIST CNN. When that does not fit,
or the run keeps its client state in host memory or on disk, the embedding streams
(`streamed_client_embedding`): clients train a chunk at a time, their models go to column
blocks (in host memory or files), and the centred Gram matrix is summed block by block
(``X X^T = sum_j X[:, J] X[:, J]^T``, each block centred by its own column means): the same
numbers as the one-program path up to float32 summation order.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from mcfl.algorithms.clustered.shared import flat_models
from mcfl.algorithms.framework.base import FederatedAlgorithm
from mcfl.clustering import truncated_svd
from mcfl.clustering.distances import HIGHEST
from mcfl.clustering.svd import left_singular_from_gram
from mcfl.engine import LocalTraining, RoundClients, Start, train_and_collect
from mcfl.engine.sampling import sample_clients
from mcfl.errors import ConfigError
from mcfl.runtime import memory

# The one-program path holds the sampled models three times in float32: it is taken when that
# is at most this share of the device's free memory.
MEMORY_SHARE = 0.25
# The streamed path trains, and reads back, this many bytes of models at a time.
CHUNK_BYTES = 1 << 28


class ClientEmbedding(NamedTuple):
    clients: jax.Array  # [n] int32 client indices, ascending
    coords: jax.Array  # [n, 2] principal components of their local models
    explained: jax.Array  # [2] share of the variance each component explains


def _sampled(key, population: int, count: int):
    """The `count` clients embedded (ascending) and the key they train with."""
    sample_key, train_key = jax.random.split(key)
    return jnp.sort(sample_clients(sample_key, population, count)), train_key


def _trained_models(algorithm: FederatedAlgorithm, training: LocalTraining, state, data,
                    train_key, clients, features=None, block_size=None):
    """`clients` trained once from the models `algorithm` evaluates them with, or trains them
    from (`ClientModels.trains_from`; per-client keys: a chunk of them trains as it does among
    all)."""
    described = algorithm.client_models(state, data)
    data = described.held(data)
    trains_from = described.trains_from()
    if trains_from is None:  # rows without `train_from`: nothing shared to train from
        raise ConfigError(f"the client embedding trains each client from shared models; "
                          f"this algorithm's {type(described).__name__} names none")
    models, index = trains_from
    if index is None:
        index = jnp.zeros((data.num_clients,), jnp.int32)
    trained, _, _ = train_and_collect(
        Start(models, RoundClients(clients, index[clients]), training=training),
        data, train_key, features=features, block_size=block_size)
    return trained


def _from_gram(clients, gram, total) -> ClientEmbedding:
    u, s = left_singular_from_gram(gram, 2)
    return ClientEmbedding(clients, u * s[None, :], jnp.square(s) / jnp.maximum(total, 1e-30))


def client_embedding(algorithm: FederatedAlgorithm, training: LocalTraining, num_clients: int,
                     state, data, key, block_size=None) -> ClientEmbedding:
    """The 2-D PCA projection of `num_clients` sampled clients' local models, each trained once
    from the model `algorithm` evaluates it with (jittable, `num_clients` static; blocks of
    `block_size` clients, the run's)."""
    clients, train_key = _sampled(key, data.num_clients, num_clients)
    flat = flat_models(_trained_models(algorithm, training, state, data, train_key, clients,
                                       block_size=block_size))
    centred = flat - jnp.mean(flat, axis=0, keepdims=True)
    u, s, _ = truncated_svd(centred, 2)
    total = jnp.maximum(jnp.sum(jnp.square(centred)), 1e-30)
    return ClientEmbedding(clients, u * s[None, :], jnp.square(s) / total)


class ColumnBlocks:
    """An [n, d] float32 matrix written by rows and read by column blocks of `width` columns:
    each block in host memory, or (with `folder`) a file of its own, appended row chunk by row
    chunk, so a block is read back in one sequential read."""

    def __init__(self, n: int, d: int, width: int, folder: Optional[Path] = None):
        self.n, self.d, self.width, self.folder = n, d, width, folder
        self.bounds = [(lo, min(lo + width, d)) for lo in range(0, d, width)]
        if folder is None:
            self.blocks = [np.empty((n, hi - lo), np.float32) for lo, hi in self.bounds]
        else:
            self.blocks = [folder / f"columns_{j}.f32" for j in range(len(self.bounds))]
            for path in self.blocks:
                path.write_bytes(b"")

    def write(self, lo: int, rows: np.ndarray) -> None:
        """Rows `lo` .. `lo + len(rows)` (written in order)."""
        for block, (c0, c1) in zip(self.blocks, self.bounds):
            if self.folder is None:
                block[lo:lo + len(rows)] = rows[:, c0:c1]
            else:
                with open(block, "ab") as f:
                    f.write(np.ascontiguousarray(rows[:, c0:c1]).tobytes())

    def read(self, j: int) -> np.ndarray:
        """Block j, [n, width] (the last one zero-padded to `width` columns)."""
        lo, hi = self.bounds[j]
        block = (self.blocks[j] if self.folder is None
                 else np.fromfile(self.blocks[j], np.float32).reshape(self.n, hi - lo))
        if hi - lo < self.width:
            block = np.pad(block, [(0, 0), (0, self.width - (hi - lo))])
        return block


@jax.jit
def _add_block(gram, total, block):
    """The centred Gram matrix and sum of squares with one column block's share added (a
    zero-padded column centres to zero and adds nothing)."""
    centred = block - jnp.mean(block, axis=0, keepdims=True)
    return (gram + jnp.matmul(centred, centred.T, precision=HIGHEST),
            total + jnp.sum(jnp.square(centred)))


class EmbeddingTraining(NamedTuple):
    """How the embedded clients train their models once: the run's `algorithm` and its
    clients' `training`, `block_size` clients at a time (the run's)."""

    algorithm: FederatedAlgorithm
    training: LocalTraining
    block_size: Optional[int] = None


def streamed_client_embedding(trainer: EmbeddingTraining, num_clients: int, state, data, key,
                              on_disk: bool = False, folder: Optional[Path] = None,
                              chunk_bytes: int = CHUNK_BYTES) -> ClientEmbedding:
    """`client_embedding` with at most `chunk_bytes` of models trained or read at a time; the
    sampled models in host memory, or `on_disk` in files in a temporary folder inside `folder`
    (None: the system's temporary folder)."""
    algorithm, training, block_size = trainer
    clients, train_key = jax.jit(_sampled, static_argnums=(1, 2))(key, data.num_clients,
                                                                  num_clients)

    @jax.jit
    def train(chunk):
        return _trained_models(algorithm, training, state, data, train_key, chunk,
                               features=flat_models, block_size=block_size)

    d = jax.eval_shape(train, clients[:1]).shape[1]
    rows = max(1, min(num_clients, chunk_bytes // (4 * d)))
    width = max(1, min(d, chunk_bytes // (4 * num_clients)))
    scratch = Path(tempfile.mkdtemp(prefix="mcfl-embedding-", dir=folder)) if on_disk else None
    try:
        blocks = ColumnBlocks(num_clients, d, width, scratch)
        for lo in range(0, num_clients, rows):
            chunk = clients[lo:lo + rows]
            kept = chunk.shape[0]  # the last chunk padded with its last client: one compile
            padded = jnp.concatenate([chunk, jnp.repeat(chunk[-1:], rows - kept)])
            blocks.write(lo, np.asarray(train(padded))[:kept])
        gram = jnp.zeros((num_clients, num_clients), jnp.float32)
        total = jnp.zeros((), jnp.float32)
        for j in range(len(blocks.bounds)):
            previous = gram
            gram, total = _add_block(gram, total, blocks.read(j))
            # At most two blocks in flight: reads outrun the matmuls, and each queued block
            # holds its 256 MB (1,000 LEAF CNNs: 11 GB resident before this wait).
            jax.block_until_ready(previous)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return jax.jit(_from_gram)(clients, gram, total)


def embedding_for_run(trainer: EmbeddingTraining, wanted: int, params_count: int,
                      store_kind: str, folder: Optional[Path], state, data, key
                      ) -> tuple[ClientEmbedding, str]:
    """The run's embedding of `wanted` clients (at most all) and where its models were:
    "device" (one program) when the run's client store is the device's and three copies of
    the models take at most `MEMORY_SHARE` of its free memory; else streamed through host
    memory when the models fit half of it, or through files in `folder` (None: the system's
    temporary folder)."""
    algorithm, training, block_size = trainer
    count = max(1, min(wanted, int(data.num_clients)))
    models_bytes = 4 * count * params_count
    if store_kind == "device" and 3 * models_bytes <= MEMORY_SHARE * memory.device_available():
        embed = jax.jit(functools.partial(client_embedding, algorithm, training, count,
                                          block_size=block_size))
        return embed(state, data, key), "device"
    kind = store_kind if store_kind != "device" else (
        "host" if models_bytes <= memory.host_available() / 2 else "disk")
    found = streamed_client_embedding(trainer, count, state, data, key,
                                      on_disk=kind == "disk", folder=folder)
    return found, kind
