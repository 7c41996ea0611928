"""An algorithm run on the device: its state, its clients' rows and the transform's state in one
pytree, rounds as one jittable function, evaluation.

`on_device(algorithm, transform)` gives what a run's program compiles (`mcfl.runs.program`) and
what the Python API offers below `mcfl.run`:

* ``init(data, key, hp) -> DeviceState``: the algorithm's state, every client's row of its
  per-client state ([C, ...] in the store's dtype: the device store), and the transform's state;
* ``round(state, data, key, hp, round) -> (state, metrics)``: the round's participants (stage
  (a), `FederatedAlgorithm.participants`), their rows gathered, the round run with them in its
  `Exchange`, the trained rows scattered back.

A host or disk store (`mcfl.runs.stored_rounds`) runs the same round (`train_rows`) on
rows it reads itself, so every store gives the same numbers. `scan_rounds` runs many rounds as
one `lax.scan`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from mcfl import engine
from mcfl.algorithms.framework.base import (
    Exchange,
    FederatedAlgorithm,
    Hyperparams,
    PerClientModels,
    RowModels,
    SharedModels,
)
from mcfl.algorithms.framework.stored import (
    counts_in_chunks,
    evaluate_rows,
    evaluated_floats,
    fresh_like,
    to_storage,
    to_training,
)
from mcfl.engine import evaluate_clients
from mcfl.transforms import IDENTITY, MessageTransform, initial_state

# Folded into a round's key for the transform's server part (noise), so that it draws nothing
# the algorithm draws.
TRANSFORM_KEY = 0x7472


class DeviceState(flax.struct.PyTreeNode):
    """A run's state on the device: the algorithm's, its clients' rows [C, ...] in the
    storage dtype (None when it keeps none) and the message transform's."""

    algorithm: Any
    rows: Any = None
    transform: Any = None


class OnDevice(NamedTuple):
    """`algorithm` with everything on the device (module docstring)."""

    algorithm: FederatedAlgorithm
    init: Any
    round: Any


def exchange_for(transform: MessageTransform, clients, rows, transform_state,
                 key, present=None) -> Exchange:
    """The exchange of round `key` for `clients` whose rows are `rows` (training dtypes);
    `present`: which of them report (None: all)."""
    return Exchange(clients, rows, transform_state, None,
                    jax.random.fold_in(key, TRANSFORM_KEY), present, transform=transform)


def split_participants(chosen) -> tuple[jax.Array, Any]:
    """``(clients [S], present [S] or None)`` from what `FederatedAlgorithm.participants`
    returned: the clients, or ``(clients, present)`` for a Poisson-sampled round
    (`mcfl.privacy.sampling`)."""
    if isinstance(chosen, tuple):
        return chosen
    return chosen, None


def kept_rows(old, new, present):
    """The rows a round writes back: the trained ones, and the old ones of the slots that did
    not report."""
    if present is None:
        return new
    return jax.tree.map(lambda o, n: jnp.where(
        present.reshape((-1,) + (1,) * (n.ndim - 1)) > 0, n, o), old, new)


def train_rows(algorithm: FederatedAlgorithm, transform: MessageTransform = IDENTITY):
    """The round itself, on rows given to it, written once for every client store:
    ``train(state, stored, clients, present, data, key, hp) -> (algorithm state, transform
    state, rows to write back, metrics)``. `stored` are the `clients`' rows [S, ...] in the
    storage dtype (None for an algorithm that keeps none), `present` which of them report
    (None: all). The device store gathers and scatters the rows inside its jitted round
    (`on_device`); a host or disk store hands them in and writes them back itself
    (`mcfl.runs.stored_rounds`)."""
    client_state = algorithm.client_state

    def train(state: DeviceState, stored, clients, present, data, key, hp: Hyperparams):
        rows = None
        if stored is not None:
            rows = to_training(stored, fresh_like(client_state, state.algorithm))
        exchange = exchange_for(transform, clients, rows, state.transform, key, present)
        new_state, metrics, exchange = algorithm.round(state.algorithm, data, key, hp,
                                                       exchange)
        written = None
        if stored is not None:
            # the participants that reported, as the round leaves it (a Poisson round's
            # slots, the clients that dropped out: `mcfl.system`)
            written = kept_rows(stored, to_storage(exchange.rows, client_state.dtype),
                                exchange.present)
        return new_state, exchange.transform_state, written, metrics

    return train


def round_participants(algorithm: FederatedAlgorithm, state, data, key, round_index
                       ) -> tuple[jax.Array, Any]:
    """``(clients [S], present [S] or None)`` of the round `key` (stage (a))."""
    return split_participants(algorithm.participants(state, data, key, round_index))


def on_device(algorithm: FederatedAlgorithm,
              transform: MessageTransform = IDENTITY) -> OnDevice:
    """`algorithm` run with its rows and the transform's state on the device: the device
    store, whose gather and scatter are inside the round (`train_rows`)."""
    client_state = algorithm.client_state
    has_rows = algorithm.rows
    train = train_rows(algorithm, transform)

    def init(data, key, hp: Hyperparams) -> DeviceState:
        state = algorithm.init(data, key, hp)
        rows = None
        if has_rows:
            clients = jnp.arange(data.num_clients, dtype=jnp.int32)
            rows = to_storage(client_state.fresh(state, clients), client_state.dtype)
        return DeviceState(state, rows, initial_state(transform, hp.privacy))

    def round_(state: DeviceState, data, key, hp: Hyperparams, round_index):
        clients, present = round_participants(algorithm, state.algorithm, data, key,
                                              round_index)
        stored = None
        if has_rows:
            stored = jax.tree.map(lambda all_rows: all_rows[clients], state.rows)
        new_state, transform_state, written, metrics = train(state, stored, clients, present,
                                                             data, key, hp)
        all_rows = state.rows
        if has_rows:
            all_rows = jax.tree.map(lambda everyone, r: everyone.at[clients].set(r),
                                    state.rows, written)
        return DeviceState(new_state, all_rows, transform_state), metrics

    return OnDevice(algorithm, init, round_)


def scan_rounds(device: OnDevice, hp: Hyperparams, state: DeviceState, data,
                rounds_key: jax.Array, first_round, num_rounds: int):
    """Run rounds ``first_round .. first_round + num_rounds - 1`` with `hp` as one `lax.scan`,
    with no host round-trip between them; round r uses ``fold_in(rounds_key, r)`` as
    `mcfl.run` does, so the result equals running them one by one. Returns the final state and
    each metric stacked [num_rounds]. Jit it with `num_rounds` static."""
    if isinstance(device, FederatedAlgorithm):
        device = on_device(device)

    def body(carry, r):
        return device.round(carry, data, jax.random.fold_in(rounds_key, r), hp, r)

    rounds = first_round + jnp.arange(num_rounds, dtype=jnp.int32)
    return jax.lax.scan(body, state, rounds)


def newcomer_models(algorithm: FederatedAlgorithm, state, data, unseen):
    """(models [M, ...], index [U] or None) a client that never trained may be served with
    (`ClientModels.newcomers`, its index from the algorithm's own rule where it has one; without
    them, the one global model an algorithm evaluates every client with), `unseen` being the
    data of such clients; None for an algorithm whose clients are served by models of their own
    (Local, FedRep, FedEM's mixtures)."""
    described = algorithm.client_models(state, data)
    if described.newcomers is not None:
        models, assign = described.newcomers
        return models, None if assign is None else assign(unseen)
    if isinstance(described, SharedModels) and described.index is None \
            and described.apply is None:  # one global model
        return described.models, None
    return None


def evaluation_counts(algorithm: FederatedAlgorithm, apply_fn, block_size: int,
                      state: DeviceState, data):
    """Per-client test counts of the models `algorithm` evaluates each client with (on the
    data as the clients hold it now), and the clients' test row counts. `apply_fn` is the
    model's; an algorithm whose client models are something else (FedEM's mixtures) brings its
    own."""
    described = algorithm.client_models(state.algorithm, data)
    if isinstance(described, RowModels) != algorithm.rows:
        raise TypeError(f"an algorithm {'with' if algorithm.rows else 'without'} per-client "
                        f"rows gave {type(described).__name__}")
    apply_fn = described.apply or apply_fn
    data = described.held(data)
    if isinstance(described, RowModels):  # chunk by chunk, as a host or disk store does
        client_state = algorithm.client_state
        row_floats = evaluated_floats(client_state, state.algorithm)

        def chunk_counts(clients):
            stored = jax.tree.map(lambda r: r[clients], state.rows)
            return evaluate_rows(client_state, apply_fn, block_size, state.algorithm,
                                 state.algorithm, stored, jnp.ones(clients.shape, bool),
                                 clients, data)

        return counts_in_chunks(chunk_counts, data.num_clients, row_floats), data.test_counts
    if isinstance(described, PerClientModels):  # made per client (Per-FedAvg's step)
        row_floats = sum(x[0].size for x in jax.tree.leaves(described.made_from))

        def personal_counts(clients):
            return evaluate_clients(apply_fn, data, described.of_clients(clients), clients,
                                    block_size)

        return counts_in_chunks(personal_counts, data.num_clients, row_floats), \
            data.test_counts
    if not isinstance(described, SharedModels):
        raise TypeError(f"unknown kind of client models: {type(described).__name__}")
    index = described.index
    if index is None:
        index = jnp.zeros((data.num_clients,), jnp.int32)
    return (engine.evaluate_counts(apply_fn, data, described.models, index, block_size),
            data.test_counts)
