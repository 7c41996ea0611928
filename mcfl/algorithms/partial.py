"""Partial personalisation: some of the model's layers are each client's own, the others are
shared through FedAvg.

* FedPer (Arivazhagan, Aggarwal, Singh and Choudhary, 2019, "Federated Learning with
  Personalization Layers", Sec. 3): the base layers (the first ones) are shared, the
  personalisation layers (the last `fedper_layers`) stay on each client.
* LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov and Morency, 2020,
  "Think Locally, Act Globally: Federated Learning with Local and Global Representations",
  Alg. 1): the local representation (the first `lg_local_layers` layers) stays on each
  client, the global layers (the rest) are shared.

A round: the sampled clients train their whole model (the shared layers as the server has
them, their own layers as they left them) for E local epochs; the server sets the shared
layers to the mean of theirs, weighted by n_i (FedAvg, McMahan et al. 2017, Alg. 1), and each
client keeps its own trained layers. A client that never trained has W_0's layers. Each client
is evaluated with the shared layers and its own (both papers' personalised score).

"Layers" are the model's top-level parameter entries in the order its forward pass creates
them (flax: ``Dense_0``, ``Dense_1``, ...). The clients' own layers are rows of the run's
client store (`mcfl.algorithms.stored`): on the device, in host memory or on disk.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from mcfl.algorithms.base import FederatedAlgorithm, stack, training_metrics
from mcfl.algorithms.registry import AlgorithmContext, register
from mcfl.algorithms.stored import ClientRows, sampled_each_round, with_client_rows
from mcfl.engine import RoundClients, train_and_collect
from mcfl.errors import ConfigError
from mcfl.settings import setting


def layer_names(model) -> list[str]:
    """The model's top-level parameter entries in creation order (the forward pass's order:
    jitted code returns dicts with sorted keys, so the model is initialised eagerly here)."""
    with jax.ensure_compile_time_eval():
        variables = model.init(jax.random.key(0))
    params = variables["params"] if model.collections else variables
    return list(params)


def own_layers(model, count: int, last: bool, setting_key: str) -> frozenset[str]:
    """The `count` first (or `last`) layers of `model`: a client's own."""
    names = layer_names(model)
    if not 1 <= count < len(names):
        raise ConfigError(f"{setting_key}={count}: the model has {len(names)} layers "
                          f"({', '.join(names)}); between 1 and {len(names) - 1} can be a "
                          f"client's own, the rest are shared")
    return frozenset(names[-count:] if last else names[:count])


def split(tree, own: frozenset[str], collections: tuple[str, ...]):
    """(shared part, own part) of a model (or a stack of models): dicts of its layers."""
    def part(layers, mine: bool):
        return {name: value for name, value in layers.items() if (name in own) == mine}

    if not collections:
        return part(tree, False), part(tree, True)
    return ({c: part(tree[c], False) for c in tree}, {c: part(tree[c], True) for c in tree})


def joined(shared, mine, collections: tuple[str, ...]):
    """The model from its two parts (`split`'s inverse)."""
    if not collections:
        return {**shared, **mine}
    return {c: {**shared[c], **mine[c]} for c in shared}


def partial_personalisation(name: str, context: AlgorithmContext, own_of) -> FederatedAlgorithm:
    """FedAvg on the layers not in ``own_of(hp.params)``; those are each client's rows.

    The shared state is (shared layers, W_0's own layers): its structure says which layers
    are a client's own, so that fresh rows and models need no hyperparameters."""
    model, clients_per_round = context.model, context.clients_per_round
    collections = tuple(model.collections)

    def init_shared(data, key, hp):
        del data
        return split(model.init(key), own_of(hp.params), collections)

    def fresh(shared, clients):
        return stack(shared[1], clients.shape[0])

    sample = sampled_each_round(clients_per_round)

    def round_(shared, rows, clients, data, key, hp):
        train_key = jax.random.split(key)[1]
        size = clients.shape[0]
        start = joined(stack(shared[0], size), rows, collections)
        trained, stats = train_and_collect(
            hp.training, data, train_key, start,
            RoundClients(clients, jnp.arange(size, dtype=jnp.int32)))
        own = frozenset(shared[1]["params"] if collections else shared[1])
        trained_shared, trained_own = split(trained, own, collections)
        weights = data.train_counts[clients].astype(jnp.float32)
        share = weights / jnp.maximum(jnp.sum(weights), 1e-30)
        averaged = jax.tree.map(
            lambda x: jnp.tensordot(share, x.astype(jnp.float32), axes=1).astype(x.dtype),
            trained_shared)
        return (averaged, shared[1]), trained_own, training_metrics(weights, stats)

    def models(shared, rows, clients):
        return joined(stack(shared[0], clients.shape[0]), rows, collections)

    return with_client_rows(name, ClientRows(init_shared, fresh, sample, round_, models),
                            context.store_dtype)


@dataclasses.dataclass(frozen=True)
class FedPerParams:
    layers: int = setting(1, "personalisation layers: the model's last this many layers stay "
                          "on each client (the paper's K_P)", key="fedper_layers", minimum=1)


@register("fedper", FedPerParams, reference="Arivazhagan et al., 2019, FedPer",
          summary="clients train the whole model; the base layers are averaged (FedAvg), the "
          "last fedper_layers stay each client's own; evaluated with them")
def fedper(context: AlgorithmContext) -> FederatedAlgorithm:
    return partial_personalisation(
        "fedper", context,
        lambda params: own_layers(context.model, params.layers, True, "fedper_layers"))


@dataclasses.dataclass(frozen=True)
class LGParams:
    local_layers: int = setting(1, "local representation: the model's first this many layers "
                                "stay on each client; the rest are global (averaged)",
                                key="lg_local_layers", minimum=1)


@register("lg_fedavg", LGParams, reference="Liang et al., 2020, LG-FedAvg",
          summary="clients train the whole model; the first lg_local_layers (the local "
          "representation) stay each client's own, the global layers are averaged (FedAvg)")
def lg_fedavg(context: AlgorithmContext) -> FederatedAlgorithm:
    return partial_personalisation(
        "lg_fedavg", context,
        lambda params: own_layers(context.model, params.local_layers, False, "lg_local_layers"))
