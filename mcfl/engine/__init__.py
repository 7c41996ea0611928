"""The client engine: local training of many clients as one jitted computation.

Modules, one job each (see docs/architecture.md, "How the engine works"):

* `training`: one client's local training (`LocalTraining`: what a client does in a round;
  `local_train`, and `local_train_factored` for a CNN's one large layer).
* `lowrank`: the exact factored path of a dense ReLU stack trained with plain SGD.
* `batch_rule`: which rows step s of client i reads: each epoch visits the client's rows in
  the order of a permutation keyed by ``fold_in(fold_in(round_key, i), epoch)``, evaluated
  only at the positions a step reads, so a round touches its own clients' rows only and a
  client's batches depend on nothing else (not the other clients, the blocking or sampling).
* `blocks`: clients sorted by their step count and cut into blocks (vmapped inside, one block
  after another, dealt over the devices of a client mesh); map or reduce a per-client
  function over them.
* `segments`: weighted per-segment sums and means (every aggregation of client models).
* `clients`: the round primitives every algorithm shares (`train_and_aggregate`,
  `train_and_collect`).
* `client_data`: loops over one client's data rows in chunks (full-batch gradients).
* `evaluate`: per-client evaluation counts.

A primitive that serves one algorithm lives with that algorithm (FedSGD's and FedDANE's
gradient exchanges, IFCA's losses, FeSEM's nearest centers).
"""

from mcfl.engine.blocks import (
    CLIENT_AXIS,
    BlockSums,
    block_size_for,
    by_length,
    client_mesh,
    client_shards,
    default_block_size,
    map_blocks,
    map_clients,
    occasional_cond,
    reduce_blocks,
    reduce_clients,
)
from mcfl.engine.client_data import (
    CLIENT_ROWS_CHUNK,
    chunk_rows,
    full_gradient,
    gradient_of_client,
    row_losses,
    sums_over_client_rows,
)
from mcfl.engine.clients import (
    UPDATES,
    WHOLE,
    Part,
    RoundClients,
    Start,
    low_rank_capacity,
    part_at,
    server_part,
    train_and_aggregate,
    train_and_collect,
)
from mcfl.engine.evaluate import EvalCounts, evaluate_clients, evaluate_counts
from mcfl.engine.segments import segment_mean, segment_sums
from mcfl.engine.training import (
    ApplyFn,
    ClientStats,
    FastPaths,
    LocalTraining,
    PyTree,
    TrainingSpec,
    ceil_div,
    client_num_steps,
    local_train,
    local_train_factored,
    masked_cross_entropy,
    squared_distance,
)

__all__ = [
    "CLIENT_AXIS",
    "CLIENT_ROWS_CHUNK",
    "WHOLE",
    "Part",
    "ApplyFn",
    "BlockSums",
    "ClientStats",
    "EvalCounts",
    "FastPaths",
    "LocalTraining",
    "TrainingSpec",
    "PyTree",
    "RoundClients",
    "Start",
    "block_size_for",
    "by_length",
    "ceil_div",
    "chunk_rows",
    "row_losses",
    "sums_over_client_rows",
    "client_mesh",
    "client_num_steps",
    "client_shards",
    "default_block_size",
    "evaluate_clients",
    "evaluate_counts",
    "full_gradient",
    "gradient_of_client",
    "local_train",
    "local_train_factored",
    "low_rank_capacity",
    "map_blocks",
    "map_clients",
    "masked_cross_entropy",
    "occasional_cond",
    "part_at",
    "reduce_blocks",
    "reduce_clients",
    "segment_mean",
    "segment_sums",
    "UPDATES",
    "server_part",
    "squared_distance",
    "train_and_aggregate",
    "train_and_collect",
]
