"""What every algorithm is: six pure functions over an immutable state pytree.

* ``init(data, key, hp) -> state``;
* ``participants(state, data, key, round) -> clients [S]``: who takes part in round `round`
  (stage (a) of the round, `mcfl.algorithms.framework.skeleton`), from the round's key; known
  before the round runs, so that a client store can fetch their rows early. It may read the state
  only where no round changes it (a schedule's order, fixed at `init`);
* ``round(state, data, key, hp, exchange) -> (state, metrics, exchange)``, jittable, with
  `metrics` a dict of scalars. `exchange` (`Exchange`) is what passes between the server and the
  round's clients besides the models: who takes part, their rows of per-client state, the
  transform their messages go through, their own normalisation layers (FedBN). A round reads
  and replaces it, never keeps it;
* ``client_models(state, data) -> ClientModels``: the model each client is evaluated with,
  of one of three kinds (`SharedModels`: one global model, K clusters' or one per client;
  `PerClientModels`: made per client from its data; `RowModels`: its rows');
* ``assignments(state) -> [C]``: each client's cluster (clustered algorithms; else None);
* ``client_state``: what the algorithm keeps per client (`ClientState`: rows a client store
  can hold on the device, in host memory or on disk, or a start that trains every client), or
  None.

Hyperparameters are an argument, as evosax's ``ask(key, state, params)`` takes its params:
`hp` (`Hyperparams`) holds the clients' local training, with its learning rate, and the
algorithm's own hyperparameters (its registered dataclass, ``hp.params``). Both are pytrees
whose leaves are the traced settings (floats), so a sweep over them is a vmap over `hp` and
the algorithm is built once; their static fields (ints, strings, booleans, floats marked
`settings.Static`) are Python values when the round is traced, free to shape it.

An algorithm is built in one way: a `FederatedAlgorithm` of these six; most rounds come from
`mcfl.algorithms.framework.skeleton` (stages (a)-(f) written once). How a run holds the state (rows
of per-client state on the device or in a store, the transform's state) is the run's business:
`mcfl.algorithms.framework.device` for the device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.engine import ClientStats, LocalTraining
from mcfl.engine.sampling import sample_clients
from mcfl.errors import ConfigError
from mcfl.transforms import IDENTITY, MessageTransform

State = Any


class Hyperparams(flax.struct.PyTreeNode):
    """The numbers an algorithm runs with: the clients' local training (`lr`, `momentum`
    traced; the optimizer, batch and epochs static), the algorithm's own hyperparameters
    (`params`, its registered dataclass) and the chance of a distribution-shift event a round
    (`shift_prob`, read by `mcfl.algorithms.wrappers.shift`) and DP's clipping norm and noise
    (`privacy`, read only by the transform's init: `mcfl.transforms.initial_state`). Leaves
    are arrays in a sweep, Python floats in a single run (baked into the program)."""

    training: LocalTraining
    params: Any
    shift_prob: Any = 0.0
    # the message transform's traced settings (`mcfl.privacy.mechanism.DPSettings`: a
    # sweep's dp_clip, dp_noise), None without DP
    privacy: Any = None
    # the chance a sampled client fails before reporting (`mcfl.system.clock`; read only
    # when the run's system model has dropouts)
    client_dropout: Any = 0.0


class Exchange(flax.struct.PyTreeNode):
    """What passes between the server and a round's clients besides the models, given to the
    round and returned by it (explicit, so that no algorithm reads a hidden channel):

    * `clients` [S]: the round's participants (stage (a));
    * `rows`: their rows [S, ...] of the algorithm's per-client state (`ClientState`), in
      training dtypes; the round returns the new ones (None: nothing kept per client);
    * `transform` and `transform_state`: what every message goes through (stage (d),
      `mcfl.transforms`); the engine applies it and returns the new state;
    * `norm_layers` [S, ...]: each participant's own normalisation layers (FedBN,
      `mcfl.algorithms.wrappers.local_norm`): put into its start model before it trains, and the
      trained ones returned; `norm_trained` says whether a round's training did that;
    * `key`: the key of the transform's server part (noise), split at each use;
    * `present` [S]: 1.0 for the participants that report, 0.0 for the slots that fill a
      Poisson-sampled round up to its fixed size (`mcfl.privacy.sampling`), or for those that
      drop out, miss the deadline or are not among the first to finish (`mcfl.system`);
      None: all report;
    * `step_limit` [S] int32: the local steps each participant finishes before the deadline
      (`mcfl.system.clock`); None: all of them.
    """

    clients: jax.Array
    rows: Any = None
    transform_state: Any = None
    norm_layers: Any = None
    key: Any = None
    present: Any = None
    step_limit: Any = None
    transform: MessageTransform = flax.struct.field(pytree_node=False, default=IDENTITY)
    norm_trained: bool = flax.struct.field(pytree_node=False, default=False)

    def weigh(self, weights: jax.Array) -> jax.Array:
        """The aggregation weights of the round's clients from the algorithm's `weights` [S]
        (or [S, K]: a client's shares in K components): every reporting client weighs 1 under
        a transform that asks for it (DP: one client's contribution is bounded by its clipped
        norm; a row of shares is scaled to sum to 1), and the clients that do not report
        weigh 0."""
        if not self.transform.uniform_weights and self.present is None:
            return weights  # as the algorithm gave them
        weights = jnp.asarray(weights, jnp.float32)
        if self.transform.uniform_weights:
            if weights.ndim == 1:
                weights = jnp.ones_like(weights)
            else:
                weights = weights / jnp.maximum(jnp.sum(weights, axis=1, keepdims=True), 1e-30)
        if self.present is None:
            return weights
        present = self.present.reshape((-1,) + (1,) * (weights.ndim - 1))
        return weights * present

    def reporting(self) -> jax.Array:
        """[S] float32: 1 for each participant that reports (`present`, or all of them)."""
        if self.present is None:
            return jnp.ones(self.clients.shape, jnp.float32)
        return self.present

    @classmethod
    def of(cls, clients: jax.Array, rows=None) -> Exchange:
        """The exchange of a round of `clients` (and their `rows`), with nothing transformed
        and no normalisation layers of their own."""
        return cls(clients, rows)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientModels:
    """What a state's clients are evaluated with (`FederatedAlgorithm.client_models`): one of
    three kinds, so that each consumer (evaluation, newcomers, the closing embedding, FedBN)
    dispatches on what the models are rather than on which optional field is set:
    `SharedModels` (stacked models and an index), `PerClientModels` (models made for a block
    of clients at a time) or `RowModels` (the models the per-client rows give).

    Every kind may carry: `apply`, evaluating the models when the model's own does not
    (FedEM's mixtures); `data`, the data as the clients hold it now (a distribution shift's
    view); `train_from`, (models [M, ...], index [C]) a client trains from in the closing
    embedding when those are not the evaluated ones (FedEM's components; default:
    `trains_from`); `newcomers`, ``(models [M, ...], assign)`` for a client that never trained
    (`mcfl.data.unseen`): the models it may be served with (the K clusters', the global one)
    and, for an algorithm with its own label-free rule (FLUX's descriptors), ``assign(data of
    such clients) -> [U]`` indices into them (None: the most confident is chosen,
    `mcfl.engine.newcomers`). Without `newcomers`, an algorithm evaluating every client with
    one global model serves newcomers that model, and one with models per client serves them
    none."""

    apply: Optional[Callable] = None
    data: Any = None
    train_from: Optional[tuple] = None
    newcomers: Optional[tuple] = None

    def __post_init__(self):
        if type(self) is ClientModels:
            raise TypeError("ClientModels is one of SharedModels, PerClientModels or RowModels")

    def replace(self, **changes) -> ClientModels:
        """These client models with `changes` (a shift's `data`, ...)."""
        return dataclasses.replace(self, **changes)

    def held(self, data):
        """The data as the clients hold it now: `data`, or this kind's view of it (a shift's)."""
        return data if self.data is None else self.data

    def trains_from(self) -> Optional[tuple]:
        """(models [M, ...], index [C] or None) a client trains from in the closing embedding:
        `train_from`, else this kind's own default (None: the kind has none)."""
        return self.train_from


@dataclasses.dataclass(frozen=True)
class SharedModels(ClientModels):
    """Stacked `models` [M, ...] a client is evaluated with: client i with
    ``models[index[i]]`` (None: every client with model 0, one global model). The clusters'
    models, the global one, or each client's last received model (an index row per client)."""

    models: Any
    index: Optional[jax.Array] = None

    def trains_from(self) -> Optional[tuple]:
        return self.train_from or (self.models, self.index)


@dataclasses.dataclass(frozen=True)
class PerClientModels(ClientModels):
    """Models made for a block of clients at a time, ``of_clients(clients [b]) -> models [b,
    ...]`` (Per-FedAvg's step from w on each client's own data), so that no [C, ...] of them
    is held; `made_from` [1, ...] is the model they are made from (w): its size bounds a
    chunk of evaluation, and the closing embedding trains from it."""

    of_clients: Callable
    made_from: Any

    def trains_from(self) -> Optional[tuple]:
        return self.train_from or (self.made_from, None)


@dataclasses.dataclass(frozen=True)
class RowModels(ClientModels):
    """The models the per-client rows give (`ClientState.models`), for an algorithm that
    keeps rows: evaluated chunk by chunk from the rows, wherever a client store holds them."""


class PopulationStart(NamedTuple):
    """An `init` that trains every client once and clusters the trained models (FeSEM's and
    Robust's start), cut where the population's models are: ``points(data, key, hp, clients
    [b]) -> [b, f]`` float32 features of a block of clients trained from the start, and
    ``finish(data, key, hp, source) -> state`` clusters the points read from `source` (a
    `mcfl.clustering.streamed.RowSource`) chunk by chunk. Run in full (`init`) it is one
    program on the device; with a client store the points go to the store between the two."""

    points: Callable
    finish: Callable


class ClientState(NamedTuple):
    """What an algorithm keeps per client, as a client store can hold it.

    Rows (when `fresh` is given): ``fresh(state, clients [b]) -> rows [b, ...]`` are the rows
    of clients that never trained, from the state right after `init` (Local: W_0), and
    ``models(state, rows [b], clients [b]) -> models [b, ...]`` the model each client of a
    block is evaluated with. A round receives its participants' rows in its `Exchange` and
    returns them trained. `start`: an initialisation that trains every client once
    (`PopulationStart`). `dtype`: what a store keeps rows and a start's points in (float32,
    or bfloat16)."""

    fresh: Optional[Callable] = None
    models: Optional[Callable] = None
    dtype: str = "float32"
    start: Optional[PopulationStart] = None

    @property
    def has_rows(self) -> bool:
        return self.fresh is not None


class FederatedAlgorithm(NamedTuple):
    """An algorithm (see the module docstring)."""

    init: Callable[..., State]
    participants: Callable[..., jax.Array]
    round: Callable[..., tuple[State, dict, Exchange]]
    client_models: Callable[[State, Any], ClientModels]
    assignments: Optional[Callable[[State], jax.Array]] = None
    client_state: Optional[ClientState] = None

    @property
    def rows(self) -> bool:
        """Whether the algorithm keeps rows per client."""
        return self.client_state is not None and self.client_state.has_rows


def sampling_key(round_key: jax.Array) -> jax.Array:
    """The part of a round's key that draws its participants (stage (a): `sampled`, a
    Poisson sample, a schedule), so that who takes part never shares random bits with what
    they do."""
    return jax.random.split(round_key)[0]


def training_key(round_key: jax.Array) -> jax.Array:
    """The part of a round's key its clients train with (stages (b)-(f)); the algorithm
    splits it further for steps of its own (Ditto's personal models, FedRep's head)."""
    return jax.random.split(round_key)[1]


def sampled(clients_per_round: int, key_part: Callable = None) -> Callable:
    """`participants` of an algorithm that samples `clients_per_round` distinct clients at
    random each round, with ``key_part(round key)`` (default: `sampling_key`, the round's
    other part being its `training_key`)."""
    part = key_part or sampling_key

    def participants(state, data, key, round_):
        del state, round_
        return sample_clients(part(key), data.num_clients, clients_per_round)

    return participants


def from_rows(**fields) -> Callable:
    """`client_models` of an algorithm whose clients are evaluated with the models their rows
    give (`RowModels`); `fields` as `ClientModels`' (FedEM's `apply`, ...)."""
    def client_models(state, data) -> ClientModels:
        del state, data
        return RowModels(**fields)

    return client_models


def shared_models(models, index=None, **fields) -> ClientModels:
    """`SharedModels` of stacked `models` [M, ...] (client i evaluated with
    ``models[index[i]]``; every client with model 0 when `index` is None)."""
    return SharedModels(models, index, **fields)


def refuse_mutable_state(model, algorithm: str) -> None:
    """Algorithms that step the global model by the clients' gradients (FedSGD, FedDANE) take
    them in evaluation mode, where batch-norm statistics would be trained as parameters: a model
    with mutable collections is refused in one line."""
    if model.collections:
        raise ConfigError(f"{algorithm} steps the global model by the clients' gradients, which "
                          f"would train the model's {', '.join(model.collections)} as "
                          f"parameters; use a model without batch norm (GroupNorm, LayerNorm) "
                          f"or an algorithm whose clients train locally")


def refuse_stateful(model, name: str) -> None:
    """Algorithms with their own local objective train plain models (no dropout, no batch
    norm statistics)."""
    if model.train_apply is not None or model.collections:
        raise ConfigError(f"{name} trains its own local objective and needs a model without "
                          f"dropout or batch norm; this model has a train mode "
                          f"(collections: {', '.join(model.collections) or 'none'})")


def stack(params, count: int = 1):
    """A stacked pytree [count, ...] of `count` copies of `params`."""
    return jax.tree.map(lambda p: jnp.broadcast_to(p, (count,) + p.shape), params)


def training_metrics(weights: jax.Array, stats: ClientStats) -> dict[str, jax.Array]:
    """Round metrics from the sampled clients' stats (those that report, in a Poisson round):
    train loss weighted by training samples, and FlexCFL's discrepancy (Eq. 3: the mean over
    sampled clients of ||W_i - W_t||, with W_t the model the client started the round from)."""
    w = weights.astype(jnp.float32)
    if stats.reported is not None:  # a Poisson round: over the clients that report
        reported = stats.reported.astype(jnp.float32)
        w = w * reported
        count = jnp.sum(reported)
        return {
            "train_loss": jnp.sum(w * stats.loss) / jnp.maximum(jnp.sum(w), 1.0),
            "discrepancy": jnp.sum(reported * stats.update_norm) / jnp.maximum(count, 1.0),
            "local_steps": jnp.sum(reported * stats.steps.astype(jnp.float32))
            / jnp.maximum(count, 1.0),
            "models_down": count, "models_up": count,
        }
    return {
        "train_loss": jnp.sum(w * stats.loss) / jnp.maximum(jnp.sum(w), 1.0),
        "discrepancy": jnp.mean(stats.update_norm),
        "local_steps": jnp.mean(stats.steps.astype(jnp.float32)),
        # models sent to and received from clients this round (IFCA sends K down per client)
        "models_down": jnp.float32(stats.loss.shape[0]),
        "models_up": jnp.float32(stats.loss.shape[0]),
    }


def wrapping(algorithm: FederatedAlgorithm, init: Callable, round_: Callable,
             participants: Callable, client_models: Optional[Callable] = None,
             start: Optional[PopulationStart] = None) -> FederatedAlgorithm:
    """A wrapper of `algorithm` whose state is ``(inner state, wrapper's own)`` (a distribution
    shift, a client schedule): its assignments, its per-client rows (`ClientState`: `fresh` and
    `models` on ``state[0]``) and, unless given, its client models are the inner algorithm's,
    so every client store runs it as it runs the inner one. `start`: the inner population
    start lifted to the wrapper's state (a shift's view of the data, a schedule's key)."""
    assignments = None
    if algorithm.assignments is not None:
        assignments = lambda state: algorithm.assignments(state[0])  # noqa: E731
    if client_models is None:
        client_models = lambda state, data: algorithm.client_models(state[0], data)  # noqa: E731
    inner = algorithm.client_state
    client_state = None
    if inner is not None:
        fresh = models = None
        if inner.has_rows:
            fresh = lambda state, clients: inner.fresh(state[0], clients)  # noqa: E731
            models = lambda state, rows, clients: inner.models(state[0], rows,  # noqa: E731
                                                                clients)
        client_state = ClientState(fresh, models, inner.dtype,
                                   start if inner.start is not None else None)
    return FederatedAlgorithm(init, participants, round_, client_models, assignments,
                              client_state)
