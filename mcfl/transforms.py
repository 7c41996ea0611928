"""Message transforms: what happens to the clients' messages between local training and the
server's step, for every algorithm (stage (d) of the round, `mcfl.algorithms.framework.skeleton`).

A client's *message* is its update, the trained model minus the model it started from (for
FedSGD, its gradient; for algorithms that send part of a model, that part: FedPer's shared
layers, Ditto's global model). A `MessageTransform` is a NamedTuple of pure functions, in the
style of optax's gradient transformations, with its own state:

* ``init() -> state``: the state a run starts with (None for a transform without one; an
  adaptive clipping norm is one). A transform whose numbers a sweep varies (DP's clipping
  norm and noise multiplier, `mcfl.privacy.mechanism`) also takes ``init(settings)``: the
  run's traced settings (``Hyperparams.privacy``), see `initial_state`;
* ``client(message, state) -> message``: applied to each client's message (vmapped over the
  clients of a block);
* ``server(sums, weight_sums, state, key) -> (sums, weight_sums, state)``: applied to the
  aggregated messages, the weighted per-segment sums [K, ...] of the clients' messages and
  their weights [K] (None: nothing; noise for differential privacy goes here).

Two static flags say what a transform needs of the round: `on_updates`, its server part acts on
the sums of the clients' *updates* (each trained model minus the model of the segment it is
summed into), which the engine forms from the sums of models and hands back as models
afterwards (DP's noise must not scale with the models); `uniform_weights`, every reporting
client weighs 1 in the sums (DP's sensitivity bound: one client moves a sum by at most its
clipped norm), whatever weights the algorithm gives.

A round's transform reaches the engine through its `Exchange` (`mcfl.algorithms.framework.base`),
so no algorithm knows which transform it runs with; ``mcfl.run(config, transform=...)`` and
``mcfl.sweep(..., transform=...)`` take one. `identity()` changes nothing and costs nothing:
the engine skips a transform without parts.

    import mcfl
    from mcfl.transforms import chain, clip_updates

    clipped = chain(clip_updates(1.0))
    mcfl.run(mcfl.RunConfig(algorithm="ifca"), transform=clipped)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

PyTree = Any


class MessageTransform(NamedTuple):
    """Pure functions acting on the clients' messages (see the module docstring)."""

    init: Callable[[], Any]
    client: Optional[Callable[[PyTree, Any], PyTree]] = None
    server: Optional[Callable[[PyTree, jax.Array, Any, jax.Array], tuple]] = None
    name: str = "custom"  # what a run's summary records
    on_updates: bool = False  # the server part acts on update sums (module docstring)
    uniform_weights: bool = False  # every reporting client weighs 1 (module docstring)
    # ``observe(state, norms [S], present [S], key) -> state``: the state learns from the
    # reporting clients' unclipped update norms after a skeleton round (adaptive clipping)
    observe: Optional[Callable] = None

    @property
    def acts(self) -> bool:
        """Whether it does anything (an identity transform is skipped by the engine)."""
        return self.client is not None or self.server is not None


def initial_state(transform: MessageTransform, settings=None):
    """The state `transform` starts a run with: ``init()``, or ``init(settings)`` when the run
    has traced settings for it (``Hyperparams.privacy``: a sweep's dp_noise, dp_clip)."""
    return transform.init() if settings is None else transform.init(settings)


def _no_state() -> None:
    return None


def identity() -> MessageTransform:
    """Messages as the clients make them."""
    return IDENTITY


IDENTITY = MessageTransform(_no_state, name="identity")  # (the default of every run)


def global_norm(tree: PyTree) -> jax.Array:
    """The L2 norm of all of a pytree's leaves together."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32)))
                        for x in jax.tree.leaves(tree)))


def clip_updates(max_norm: float) -> MessageTransform:
    """Each client's update scaled to L2 norm at most `max_norm` (all its leaves together), as
    DP-FedAvg clips them (McMahan, Ramage, Talwar and Zhang, ICLR 2018, "Learning
    Differentially Private Recurrent Language Models", Algorithm 1's ``ClipFn``):
    ``u * min(1, max_norm / ||u||)``."""
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0:
        raise ValueError(f"clip_updates: max_norm must be a number above 0, got {max_norm!r}")

    def client(message, state):
        del state
        norm = global_norm(message)
        scale = jnp.minimum(1.0, max_norm / jnp.maximum(norm, 1e-30))
        return jax.tree.map(lambda u: (u * scale).astype(u.dtype), message)

    return MessageTransform(_no_state, client, name=f"clip_updates({max_norm:g})")


def scale_updates(factor: float) -> MessageTransform:
    """Each client's update times `factor` (0: the clients send nothing that moves a model;
    a check that a transform reaches an algorithm's server)."""
    def client(message, state):
        del state
        return jax.tree.map(lambda u: (u * factor).astype(u.dtype), message)

    return MessageTransform(_no_state, client, name=f"scale_updates({factor:g})")


def chain(*transforms: MessageTransform) -> MessageTransform:
    """The transforms applied one after another (clients' parts in order, then servers' parts
    in order); the state is the tuple of theirs."""
    for t in transforms:
        if not isinstance(t, MessageTransform):
            raise TypeError(f"chain takes MessageTransforms, got {type(t).__name__}")

    def init():
        return tuple(t.init() for t in transforms)

    clients = [(i, t.client) for i, t in enumerate(transforms) if t.client is not None]
    servers = [(i, t.server) for i, t in enumerate(transforms) if t.server is not None]

    def client(message, state):
        for i, fn in clients:
            message = fn(message, state[i])
        return message

    def server(sums, weight_sums, state, key):
        state = list(state)
        for i, fn in servers:
            key, own = jax.random.split(key)
            sums, weight_sums, state[i] = fn(sums, weight_sums, state[i], own)
        return sums, weight_sums, tuple(state)

    name = f"chain({', '.join(t.name for t in transforms)})"
    if any(t.observe is not None for t in transforms):
        raise ValueError("chain: a transform that observes update norms (adaptive clipping) "
                         "runs on its own")
    return MessageTransform(init, client if clients else None, server if servers else None,
                            name, any(t.on_updates for t in transforms),
                            any(t.uniform_weights for t in transforms))
