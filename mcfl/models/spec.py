"""`ModelSpec`: what the engine needs of a model, built from any flax module (`from_module`).

A client's *model* is one pytree: the module's ``params``, or, for a module with mutable
collections (BatchNorm's ``batch_stats``), its whole variables dict ``{"params": ...,
"batch_stats": ...}``. Algorithms average, cluster and store that tree as it is, so by default
a client's batch statistics are aggregated with its parameters; FedBN (Li et al., 2021) keeps
them local instead (`mcfl.algorithms.wrappers.local_norm`, ``--bn local``).

A module whose ``__call__`` takes a ``train`` keyword is called with ``train=True`` in local
steps, with a ``"dropout"`` PRNG key drawn per client and per step, and ``train=False`` at
evaluation; gradients are taken with respect to ``params`` only, and the mutable collections
a training step returns replace the old ones.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import flax.errors
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.traverse_util import flatten_dict, unflatten_dict

from mcfl.errors import ConfigError, first_line

PyTree = Any


class HiddenUnits(NamedTuple):
    """The hidden units of layer `name` (the last axis of its kernel and its bias) and where
    the next layer reads them: axis `axis` of `reader`'s kernel, reshaped to `shape` first
    when given (a flattened feature map). Permuting the units and that axis together leaves
    the network's function unchanged (what matched averaging relies on)."""

    name: str
    reader: str
    axis: int
    shape: Optional[tuple[int, ...]] = None


class FactoredLayer(NamedTuple):
    """A model seen as ``head(params, trunk(params, x) @ kernel + bias)`` around one large
    dense layer `name`: what lets the engine keep that kernel's change as factors
    (`mcfl.engine.local_train_factored`) while autodiff handles everything else."""

    name: str
    trunk: Callable  # (params, x) -> [B, in]
    head: Callable  # (params, z [B, out]) -> logits


class ModelSpec(NamedTuple):
    """A model as the engine sees it: ``apply(model, x) -> logits`` (evaluation mode) and
    ``init(key) -> model``, plus what the fast paths may use.

    `apply` is built once per model, so jitted functions that take it as a static argument
    compile once per model, not once per call.
    """

    name: str
    module: nn.Module
    feature_shape: tuple[int, ...]
    apply: Callable
    # For a ReLU stack of dense layers on the flattened input: the layers' parameter names in
    # order, which lets the engine train it in factored form (`mcfl.engine.lowrank`).
    dense_layers: Optional[tuple[str, ...]] = None
    # For a model with one large dense layer after a trunk (the CNNs): that decomposition.
    factored: Optional[FactoredLayer] = None
    # The hidden layers whose units can be permuted (matched averaging, FeSEM-MA), in order
    # from the input.
    hidden_units: tuple[HiddenUnits, ...] = ()
    # The module's mutable collections (e.g. ("batch_stats",)): part of each client's model.
    collections: tuple[str, ...] = ()
    # Whether ``__call__`` takes ``train`` (dropout, batch norm).
    takes_train: bool = False
    # (model, x, key) -> (logits, model with updated collections) of a training step, for a
    # stateful model (`_train_apply_fn`); None: local steps call `apply`. A closure built once,
    # so that jitted code keyed on it compiles once per model.
    train_apply: Optional[Callable] = None

    def init(self, key: jax.Array) -> PyTree:
        dummy = jnp.zeros((1,) + tuple(self.feature_shape), jnp.float32)
        kwargs = {"train": False} if self.takes_train else {}
        variables = self.module.init(key, dummy, **kwargs)
        if not self.collections:
            return variables["params"]
        return {name: variables[name] for name in ("params", *self.collections)}


# FedBN (Li et al., 2021): a normalisation layer is local when it keeps batch statistics; its
# statistics and its own parameters (scale, bias) stay with the client.
def local_part(model: PyTree, collections: tuple[str, ...]) -> dict:
    """The normalisation layers' statistics and parameters of a client's model (`--bn
    local`), as a flat dict path -> array; empty for a model without mutable collections."""
    if not collections:
        return {}
    flat = flatten_dict(model)
    layers = {path[1:-1] for path in flat if path[0] in collections}
    return {path: leaf for path, leaf in flat.items() if path[1:-1] in layers}


def with_local_part(model: PyTree, local: dict) -> PyTree:
    """`model` with the leaves of `local` (from `local_part`) in their places."""
    return unflatten_dict({**flatten_dict(model), **local})


def trainable_part(model: PyTree, collections: tuple[str, ...]) -> PyTree:
    """The part of a client's model that gradients train: ``params``."""
    return model["params"] if collections else model


def with_trainable_part(model: PyTree, params: PyTree, collections: tuple[str, ...]) -> PyTree:
    return {**model, "params": params} if collections else params


def _train_apply_fn(module: nn.Module, collections: tuple[str, ...]) -> Callable:
    """A training step's forward: ``train=True``, a dropout key, and the mutable collections
    returned (BatchNorm's running statistics) replacing the old ones."""
    def train_apply(model, x, key):
        x = x.astype(jnp.float32)
        rngs = {"dropout": key}
        if not collections:
            return module.apply({"params": model}, x, train=True, rngs=rngs), model
        logits, updates = module.apply(model, x, train=True, rngs=rngs,
                                       mutable=list(collections))
        return logits, {**model, **updates}

    return train_apply


def _apply_fn(module: nn.Module, collections: tuple[str, ...], takes_train: bool) -> Callable:
    kwargs = {"train": False} if takes_train else {}

    if collections:
        def apply(model, x):
            return module.apply(model, x.astype(jnp.float32), **kwargs)
    else:
        def apply(params, x):
            return module.apply({"params": params}, x.astype(jnp.float32), **kwargs)

    return apply


def takes_train_keyword(module: nn.Module) -> bool:
    """Whether the module's ``__call__`` accepts ``train`` (a keyword or a parameter named so)."""
    try:
        parameters = inspect.signature(type(module).__call__).parameters
    except (TypeError, ValueError):
        return False
    return "train" in parameters


def _logits_problem(out, batch: int, num_classes: int) -> Optional[str]:
    """What is wrong with a forward pass's output (abstract, from `jax.eval_shape`) as logits
    of `batch` rows, or None: they must be floating-point [batch, num_classes]."""
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        return f"returns {type(out).__name__}; it must return an array of logits"
    if tuple(out.shape) != (batch, num_classes):
        return (f"maps inputs of {batch} rows to {tuple(out.shape)}; it must give logits of shape "
                f"({batch}, {num_classes}): one per class of the data")
    if not jnp.issubdtype(out.dtype, jnp.floating):
        return (f"returns {out.dtype} logits; it must return floating-point logits [batch, "
                f"classes] (cross-entropy and its gradient need real numbers)")
    return None


def _rng_hint(error: BaseException) -> str:
    """What to add to a failure for want of a PRNG stream (flax's `InvalidRngError`)."""
    if not isinstance(error, flax.errors.InvalidRngError):
        return ""
    return ("; mcfl gives a model one PRNG stream, 'dropout', and only in local steps, where "
            "it calls a model whose __call__ takes `train` with train=True")


def from_module(module: nn.Module, feature_shape: tuple[int, ...], num_classes: int,
                name: Optional[str] = None, **fields) -> ModelSpec:
    """A `ModelSpec` for any flax module whose ``__call__(x)`` returns logits [B, classes].

    The module is checked on the data's shapes before anything is compiled (abstractly, with
    `jax.eval_shape`: nothing is allocated): a module that fails on inputs [2, *feature_shape]
    (in evaluation mode, ``train=False``, where it takes `train`), or whose output is not
    floating-point logits [2, num_classes], is a one-line `ConfigError` naming the shapes.
    `fields` are the fast-path descriptions (`dense_layers`, `factored`, `hidden_units`) of a
    model whose structure is known. (`check_modes` traces a user's model as local training
    calls it too.)
    """
    if not isinstance(module, nn.Module):
        raise ConfigError(f"a model must be a flax.linen.Module (or a factory returning one), "
                          f"got {type(module).__name__}")
    name = name or type(module).__name__
    feature_shape = tuple(int(s) for s in feature_shape)
    takes_train = takes_train_keyword(module)
    kwargs = {"train": False} if takes_train else {}
    dummy = jax.ShapeDtypeStruct((2,) + feature_shape, jnp.float32)
    try:
        variables = jax.eval_shape(lambda k, x: module.init(k, x, **kwargs),
                                   jax.random.key(0), dummy)
        out = jax.eval_shape(lambda v, x: module.apply(v, x, **kwargs), variables, dummy)
    except Exception as e:  # noqa: BLE001 - any failure of the user's module is reported
        mode = " in evaluation mode (train=False)" if takes_train else ""
        raise ConfigError(f"model {name!r} fails{mode} on inputs of shape {(2,) + feature_shape} "
                          f"(the data's feature shape {feature_shape}): {first_line(e)}"
                          f"{_rng_hint(e)}") from None
    if "params" not in variables:
        raise ConfigError(f"model {name!r} has no parameters; it must declare trainable "
                          f"'params'")
    if hasattr(out, "shape") and tuple(out.shape) != (2, num_classes):
        raise ConfigError(f"model {name!r} maps inputs {(2,) + feature_shape} to "
                          f"{tuple(out.shape)}; it must give logits of shape (2, {num_classes}): "
                          f"one per class of the data")
    problem = _logits_problem(out, 2, num_classes)
    if problem is not None:
        raise ConfigError(f"model {name!r} {problem}")
    collections = tuple(sorted(c for c in variables if c != "params"))
    if collections and not takes_train:
        raise ConfigError(f"model {name!r} keeps mutable state ({', '.join(collections)}) but its "
                          f"__call__ takes no 'train' keyword; mcfl calls it with train=True in "
                          f"local steps and train=False at evaluation")
    apply = _apply_fn(module, collections, takes_train)
    train_apply = _train_apply_fn(module, collections) if takes_train else None
    return ModelSpec(name, module, feature_shape, apply, collections=collections,
                     takes_train=takes_train, train_apply=train_apply, **fields)


def check_modes(spec: ModelSpec, num_classes: int) -> None:
    """Trace `spec` as the engine calls it, abstractly (`jax.eval_shape`: nothing is compiled
    or allocated), so that a model failing only there is refused before a run starts, in one
    line naming the model and the mode, instead of a traceback in round 1.

    Training mode: its training forward (``train=True`` with a ``"dropout"`` PRNG key where it
    takes `train`) and the gradient of a cross-entropy in its trainable parameters, vmapped over
    clients as the engine trains them; its logits must be floating-point [rows, classes].
    Evaluation mode: its forward (``train=False``) vmapped over clients. `from_module` has
    checked one plain forward already; this is for a user's model (mcfl's own are tested)."""
    rows = 2
    x = jax.ShapeDtypeStruct((1, rows) + tuple(spec.feature_shape), jnp.float32)  # 1 client
    keys = jax.random.split(jax.random.key(0), 1)
    collections = spec.collections

    def traced(fn, *args, mode: str, how: str):
        try:
            return jax.eval_shape(jax.vmap(fn), *args)
        except Exception as e:  # noqa: BLE001 - any failure of the user's module is reported
            raise ConfigError(f"model {spec.name!r} fails {mode} ({how}): {first_line(e)}"
                              f"{_rng_hint(e)}") from None

    models = traced(spec.init, keys, mode="at initialisation", how="vmapped over clients")

    def train_forward(model, x, key):
        if spec.train_apply is None:
            return spec.apply(model, x)
        return spec.train_apply(model, x, key)[0]

    def gradient(model, x, key):
        def loss(params):
            logits = train_forward(with_trainable_part(model, params, collections), x, key)
            return -jnp.mean(jax.nn.log_softmax(logits.astype(jnp.float32))[:, 0])

        return jax.grad(loss)(trainable_part(model, collections))

    training = ("called with train=True and a 'dropout' PRNG key, " if spec.takes_train
                else "")
    for mode, how, fn, args in (
            ("training", f"{training}vmapped over clients", train_forward, (models, x, keys)),
            ("training", f"{training}differentiated in its parameters and vmapped over clients",
             gradient, (models, x, keys)),
            ("evaluation", "train=False, " * spec.takes_train + "vmapped over clients",
             spec.apply, (models, x))):
        out = traced(fn, *args, mode=f"in {mode} mode", how=how)
        if fn is not gradient:  # (one client's logits)
            problem = _logits_problem(jax.tree.map(lambda o: jax.ShapeDtypeStruct(
                o.shape[1:], o.dtype), out), rows, num_classes)
            if problem is not None:
                raise ConfigError(f"model {spec.name!r} in {mode} mode {problem}")
