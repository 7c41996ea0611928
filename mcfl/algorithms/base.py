"""What every algorithm is: a NamedTuple of pure functions over an immutable state pytree.

``init(data, key, hp) -> state``; ``round(state, data, key, hp) -> (state, metrics)``,
jittable, with `metrics` a dict of scalars; ``client_models(state) -> (models [M, ...],
index [C])`` says which model evaluates each client (M = 1 for one global model, K for
clusters, C for local models); clustered algorithms also give ``assignments(state) -> [C]``,
each client's cluster.

Hyperparameters are an argument, as evosax's ``ask(key, state, params)`` takes its params:
`hp` (`Hyperparams`) holds the clients' local training, with its learning rate, and the
algorithm's own hyperparameters (its registered dataclass, ``hp.params``). Both are pytrees
whose leaves are the traced settings (floats), so a sweep over them is a vmap over `hp` and
the algorithm is built once; their static fields (ints, strings, booleans, floats marked
`settings.Static`) are Python values when the round is traced, free to shape it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.engine import ClientStats, LocalTraining
from mcfl.errors import ConfigError

State = Any


class Hyperparams(flax.struct.PyTreeNode):
    """The numbers an algorithm runs with: the clients' local training (`lr`, `momentum`
    traced; the optimizer, batch and epochs static), the algorithm's own hyperparameters
    (`params`, its registered dataclass) and the chance of a distribution-shift event a round
    (`shift_prob`, read by `mcfl.algorithms.shift`). Leaves are arrays in a sweep, Python
    floats in a single run (baked into the program)."""

    training: LocalTraining
    params: Any
    shift_prob: Any = 0.0


class FederatedAlgorithm(NamedTuple):
    name: str
    init: Callable[..., State]
    round: Callable[..., tuple[State, dict]]
    client_models: Callable[[State], tuple[Any, jax.Array]]
    assignments: Optional[Callable[[State], jax.Array]] = None
    # The data as the clients hold it now, when a distribution shift changes it
    # (mcfl.algorithms.shift).
    view: Optional[Callable[[State, Any], Any]] = None
    # Per-client state as rows of a client store (`mcfl.algorithms.stored.ClientRows`), and
    # the dtype the rows are stored in; None: the state holds nothing per client.
    client_rows: Any = None
    store_dtype: str = "float32"
    # An initialisation that trains every client once and clusters their models, in parts a
    # client store can stream (`PopulationStart`); None: `init` only.
    population_start: Any = None
    # The apply that evaluates a client model when it is not the model's own (FedEM's
    # mixture of components); None: the model's apply.
    evaluation_apply: Optional[Callable] = None
    # ``(models [M, ...], index [C])``: the model parameters a client trains from in the
    # closing embedding, when its client models are not those (FedEM's mixtures) or are rows
    # of a client store (FedSoft's local models; the embedding reads the shared part only).
    trainable_models: Optional[Callable[[State], tuple[Any, jax.Array]]] = None
    # ``personalised(state, clients [b], data) -> models [b]``: the models the clients are
    # evaluated with when they are made from their data (Per-FedAvg's one step); None:
    # `client_models`.
    personalised: Optional[Callable] = None


class PopulationStart(NamedTuple):
    """An `init` that trains every client once and clusters the trained models (FeSEM's and
    Robust's start), cut where the population's models are: ``points(data, key, hp, clients
    [b]) -> [b, f]`` float32 features of a block of clients trained from the start, and
    ``finish(data, key, hp, source) -> state`` clusters the points read from `source` (a
    `mcfl.clustering.streamed.RowSource`) chunk by chunk. Run in full (`init`) it is one
    program on the device; with a client store the points go to the store between the two."""

    points: Callable
    finish: Callable


def refuse_mutable_state(model, algorithm: str) -> None:
    """Algorithms that step the global model by the clients' gradients (FedSGD, FedDANE) take
    them in evaluation mode, where batch-norm statistics would be trained as parameters: a model
    with mutable collections is refused in one line."""
    if model.collections:
        raise ConfigError(f"{algorithm} steps the global model by the clients' gradients, which "
                          f"would train the model's {', '.join(model.collections)} as "
                          f"parameters; use a model without batch norm (GroupNorm, LayerNorm) "
                          f"or an algorithm whose clients train locally")


def wrapping(algorithm: FederatedAlgorithm, init, round_, client_models=None,
             view=None) -> FederatedAlgorithm:
    """A wrapper of `algorithm` whose state is ``(inner state, wrapper's own)`` (a distribution
    shift, a client schedule, FedBN's local layers): its assignments and, unless given, its
    client models and data view are the inner algorithm's on ``state[0]``."""
    assignments = None
    if algorithm.assignments is not None:
        assignments = lambda state: algorithm.assignments(state[0])  # noqa: E731
    if client_models is None:
        client_models = lambda state: algorithm.client_models(state[0])  # noqa: E731
    if view is None and algorithm.view is not None:
        view = lambda state, data: algorithm.view(state[0], data)  # noqa: E731
    trainable = None
    if algorithm.trainable_models is not None:
        trainable = lambda state: algorithm.trainable_models(state[0])  # noqa: E731
    personalised = None
    if algorithm.personalised is not None:
        personalised = lambda state, clients, data: algorithm.personalised(  # noqa: E731
            state[0], clients, data)
    return FederatedAlgorithm(algorithm.name, init, round_, client_models, assignments, view,
                              evaluation_apply=algorithm.evaluation_apply,
                              trainable_models=trainable, personalised=personalised)


def stack(params, count: int = 1):
    """A stacked pytree [count, ...] of `count` copies of `params`."""
    return jax.tree.map(lambda p: jnp.broadcast_to(p, (count,) + p.shape), params)


# The metric under which a round hands its clients' trained local parts (FedBN) to
# `mcfl.algorithms.local_norm`, which removes it before the metrics go anywhere.
CLIENT_LOCAL = "client_local"


def training_metrics(weights: jax.Array, stats: ClientStats) -> dict[str, jax.Array]:
    """Round metrics from the sampled clients' stats: train loss weighted by training samples,
    and FlexCFL's discrepancy (Eq. 3: the mean over sampled clients of ||W_i - W_t||, with W_t
    the model the client started the round from)."""
    w = weights.astype(jnp.float32)
    local = {} if stats.local is None else {CLIENT_LOCAL: (stats.client, stats.local)}
    return local | {
        "train_loss": jnp.sum(w * stats.loss) / jnp.maximum(jnp.sum(w), 1.0),
        "discrepancy": jnp.mean(stats.update_norm),
        "local_steps": jnp.mean(stats.steps.astype(jnp.float32)),
        # models sent to and received from clients this round (IFCA sends K down per client)
        "models_down": jnp.float32(stats.loss.shape[0]),
        "models_up": jnp.float32(stats.loss.shape[0]),
    }


def scan_rounds(algorithm: FederatedAlgorithm, hp: Hyperparams, state, data,
                rounds_key: jax.Array, first_round, num_rounds: int):
    """Run rounds ``first_round .. first_round + num_rounds - 1`` of `algorithm` with `hp` as
    one `lax.scan`, with no host round-trip between them; round r uses
    ``fold_in(rounds_key, r)`` as `mcfl.run` does, so the result equals running them one by
    one. Returns the final state and each metric stacked [num_rounds]. Jit it with `num_rounds`
    static."""

    def body(carry, r):
        new_state, metrics = algorithm.round(carry, data, jax.random.fold_in(rounds_key, r), hp)
        return new_state, metrics

    rounds = first_round + jnp.arange(num_rounds, dtype=jnp.int32)
    return jax.lax.scan(body, state, rounds)
