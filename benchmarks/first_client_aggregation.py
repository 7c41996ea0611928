"""Checks a cause of FeSEM's gap in FlexCFL's tables: the FlexCFL authors' code aggregates
FeSEM's (and IFCA's) clusters by applying only the first sampled member's update, so a
cluster's new model is that one client's model; mcfl averages the members (FeSEM Eq. 10,
IFCA Alg. 1). This script registers those two aggregations as algorithms of its own (they are
not part of mcfl: the library implements the papers) and runs them beside mcfl's FeSEM and
IFCA on FlexCFL Table III's Synthetic(1,1) setting:

    python benchmarks/first_client_aggregation.py                 # 300 rounds, seeds 2077-2079
    python benchmarks/first_client_aggregation.py --rounds 60 --seeds 1

Prints each cell's score by the paper's rule (mean +/- std over the seeds, in percent).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from mcfl.algorithms import AlgorithmContext, register
from mcfl.algorithms.clustered.fesem import FeSEMParams, fesem, nearest_models, prox_scale
from mcfl.algorithms.clustered.ifca import IFCAParams, ifca, losses_of_models
from mcfl.algorithms.clustered.shared import features_fn, reassign
from mcfl.algorithms.framework.base import FederatedAlgorithm, training_metrics
from mcfl.config import from_dict
from mcfl.engine import RoundClients, Start, train_and_collect
from mcfl.reproduce import get
from mcfl.runs.records import PAPER_SCORE


def first_member_models(trained, clusters, current, num_clusters: int):
    """[K, ...]: each cluster's first member (in sampling order) among the round's trained
    models [S, ...]; a cluster without one keeps its model."""
    member = clusters[None, :] == jnp.arange(num_clusters)[:, None]  # [K, S]
    first, has = jnp.argmax(member, axis=1), jnp.any(member, axis=1)
    return jax.tree.map(
        lambda t, c: jnp.where(has.reshape((-1,) + (1,) * (c.ndim - 1)), t[first], c),
        trained, current)


def first_client_round(context: AlgorithmContext, training_of, identities, prox_scale=None):
    """A round of a clustered algorithm whose M-step keeps each cluster's first member:
    `identities(state, data, clients, trained, hp)` gives each client's cluster, before
    training (IFCA: `trained` is None) or after it (FeSEM's E-step); `training_of(hp)` is the
    clients' local training."""
    num_clusters = context.num_clusters

    def round_(state, data, key, hp, exchange):
        train_key = jax.random.split(key)[1]
        clients = exchange.clients
        before = identities(state, data, clients, None, hp)
        start = state.assignment[clients] if before is None else before
        scale = 1.0 if prox_scale is None else prox_scale(data, clients)
        trained, stats, exchange = train_and_collect(
            Start(state.models, RoundClients(clients, start), training=training_of(hp),
                  prox_scale=scale),
            data, train_key, exchange=exchange, block_size=context.block_size)
        joined = before if before is not None else identities(state, data, clients, trained, hp)
        models = first_member_models(trained, joined, state.models, num_clusters)
        assignment, sizes = reassign(state.assignment, state.sizes, clients, joined)
        metrics = training_metrics(data.train_counts[clients], stats)
        return state.replace(models=models, assignment=assignment, sizes=sizes,
                             round=state.round + 1), metrics, exchange

    return round_


@register("fesem_first_client", FeSEMParams, clustered=True, reference="FlexCFL authors' code",
          summary="FeSEM whose M-step keeps each cluster's first member (a check, not mcfl's)")
def fesem_first_client(context: AlgorithmContext) -> FederatedAlgorithm:
    base = fesem(context)  # its start (k-means on local models) and evaluation

    def identities(state, data, clients, trained, hp):
        if trained is None:
            return None  # FeSEM's E-step comes after training
        features = features_fn(hp.params.last_layer)
        return nearest_models(jax.vmap(features)(trained), jax.vmap(features)(state.models))

    round_ = first_client_round(context, lambda hp: hp.training.replace(mu=2.0 * hp.params.lam),
                                identities, prox_scale)
    return base._replace(round=round_)


@register("ifca_first_client", IFCAParams, clustered=True, reference="FlexCFL authors' code",
          summary="IFCA whose clusters keep their first member's model (a check, not mcfl's)")
def ifca_first_client(context: AlgorithmContext) -> FederatedAlgorithm:
    base = ifca(context)

    def identities(state, data, clients, trained, hp):
        losses = losses_of_models(context.model.apply, data, state.models, clients,
                                  block_size=context.block_size)
        return jnp.argmin(losses, axis=1).astype(jnp.int32)

    round_ = first_client_round(context, lambda hp: hp.training, identities)
    return base._replace(round=round_)


def main() -> None:
    from mcfl.sweeps import sweep

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    base = from_dict({**get("flexcfl-table3-synthetic").base(), "rounds": args.rounds})
    seeds = [base.seed + i for i in range(args.seeds)]
    print(f"FlexCFL Table III, Synthetic(1,1)-MCLR, {args.rounds} rounds, seeds {seeds}; "
          "score by the paper's rule, %")
    for algorithm in ("fesem", "fesem_first_client", "ifca", "ifca_first_client"):
        result = sweep(base.replace(algorithm=algorithm, data_seed=base.seed), seeds=seeds)
        point = result.summary[0]
        mean, std = 100 * point[f"{PAPER_SCORE}_mean"], 100 * point[f"{PAPER_SCORE}_std"]
        per_seed = [round(100 * m[PAPER_SCORE], 1) for m in result.members]
        print(f"{algorithm:20s} {mean:5.1f} +/- {std:.1f}   {per_seed}", flush=True)


if __name__ == "__main__":
    main()
