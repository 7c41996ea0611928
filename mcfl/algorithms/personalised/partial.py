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
client store (`mcfl.algorithms.framework.stored`): on the device, in host memory or on disk.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from mcfl.algorithms.framework.base import (
    ClientState,
    FederatedAlgorithm,
    from_rows,
    sampled,
    stack,
    training_key,
    training_metrics,
)
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import weighted_mean_of
from mcfl.engine import Part, RoundClients, Start, train_and_collect
from mcfl.errors import ConfigError
from mcfl.settings import setting


def layer_names(model) -> list[str]:
    """The model's top-level parameter entries in creation order (the forward pass's order:
    jitted code returns dicts with sorted keys, so the model is initialised eagerly here)."""
    with jax.ensure_compile_time_eval():
        variables = model.init(jax.random.key(0))
    params = variables["params"] if model.collections else variables
    return list(params)


def own_layers(model, count: int, last: bool, setting_key: str, needs: str) -> frozenset[str]:
    """The `count` first (or `last`) layers of `model`: a client's own. `needs` says what the
    algorithm needs of a model ("fedrep needs a model with a body and a head"), for a model of
    one layer, which no count can split."""
    names = layer_names(model)
    if len(names) < 2:
        raise ConfigError(f"{needs} (at least two layers), e.g. --model mlp; {model.name!r} has "
                          f"one ({names[0] if names else 'none'})")
    if not 1 <= count < len(names):
        allowed = "1" if len(names) == 2 else f"1 to {len(names) - 1}"
        raise ConfigError(f"{setting_key}={count}: model {model.name!r} has {len(names)} layers "
                          f"({', '.join(names)}); allowed: {allowed} (a client's own; the rest "
                          f"are shared)")
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


def partial_personalisation(context: AlgorithmContext, own_of) -> FederatedAlgorithm:
    """FedAvg on the layers not in ``own_of(hp.params)``; those are each client's rows.

    The state is (shared layers, W_0's own layers): its structure says which layers are a
    client's own, so that fresh rows and models need no hyperparameters. A client's message is
    its shared layers' update (through the run's transform); its own layers stay with it. The
    server's mean is of collected messages, so the round is written here (stages (c)-(e) as
    `train_and_collect` and `skeleton.weighted_mean_of`)."""
    model = context.model
    collections = tuple(model.collections)

    def init(data, key, hp):
        del data
        return split(model.init(key), own_of(hp.params), collections)

    def fresh(state, clients):
        return stack(state[1], clients.shape[0])

    def round_(state, data, key, hp, exchange):
        train_key = training_key(key)
        clients, rows = exchange.clients, exchange.rows
        size = clients.shape[0]
        own = frozenset(state[1]["params"] if collections else state[1])
        sent = Part(lambda tree: split(tree, own, collections)[0],
                    lambda tree, shared: joined(shared, split(tree, own, collections)[1],
                                                collections))
        start = joined(stack(state[0], size), rows, collections)
        trained, stats, exchange = train_and_collect(
            Start(start, RoundClients(clients, jnp.arange(size, dtype=jnp.int32)),
                  training=hp.training),
            data, train_key, exchange=exchange, sent=sent, block_size=context.block_size)
        trained_shared, trained_own = split(trained, own, collections)
        weights = data.train_counts[clients].astype(jnp.float32)
        averaged, exchange = weighted_mean_of(trained_shared, weights, exchange, state[0])
        return ((averaged, state[1]), training_metrics(weights, stats),
                exchange.replace(rows=trained_own))

    def models(state, rows, clients):
        return joined(stack(state[0], clients.shape[0]), rows, collections)

    return FederatedAlgorithm(init, sampled(context.clients_per_round), round_, from_rows(),
                              client_state=ClientState(fresh, models, context.store_dtype))


@dataclasses.dataclass(frozen=True)
class FedPerParams:
    layers: int = setting(1, "personalisation layers: the model's last this many layers stay "
                          "on each client (the paper's K_P)", key="fedper_layers", minimum=1)


@register("fedper", FedPerParams, reference="Arivazhagan et al., 2019, FedPer",
          summary="clients train the whole model; the base layers are averaged (FedAvg), the "
          "last fedper_layers stay each client's own; evaluated with them")
def fedper(context: AlgorithmContext) -> FederatedAlgorithm:
    return partial_personalisation(
        context,
        lambda params: own_layers(context.model, params.layers, True, "fedper_layers",
                                  "fedper needs a model with base layers to share and "
                                  "personalisation layers to keep"))


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
        context,
        lambda params: own_layers(context.model, params.local_layers, False, "lg_local_layers",
                                  "lg_fedavg needs a model with local layers to keep and "
                                  "global layers to share"))
