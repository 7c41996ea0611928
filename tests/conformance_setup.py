"""The small problem every registered algorithm is checked on (tests/test_conformance.py and its
multi-device subprocess): 40 clients of 12-feature Gaussian data, 3 classes each (so that
swap_part has labels to trade), with 4 planted label permutations; MCLR, 8 clients a round,
2 local steps, K = 3."""

from __future__ import annotations

import optax

from mcfl import settings
from mcfl.algorithms import AlgorithmContext, get
from mcfl.engine import LocalTraining
from mcfl.models import make_model

SETTINGS = {"clients": 40, "per_round": 8, "block": 4, "clusters": 3, "rounds": 3}
# Hyperparameters scaled to the small problem, for the algorithms that take them.
SMALL = {"pretrain_scale": 2, "cfl_warmup": 1, "fesem_restarts": 2}


def planted_data():
    from conftest import planted_gaussian

    return planted_gaussian(SETTINGS["clients"], labels="shards:3")


def small_params(name: str) -> dict:
    takes = settings.fields_of(get(name).params)
    return {k: v for k, v in SMALL.items() if k in takes}


def build_small(name: str):
    model = make_model("mclr", (12,), 10)
    training = LocalTraining(model.apply, optax.sgd(0.05), batch_size=10, local_steps=2,
                             sgd_lr=0.05, dense_layers=model.dense_layers)
    clusters = SETTINGS["clusters"] if get(name).clustered else 1
    context = AlgorithmContext(model, training, SETTINGS["per_round"], SETTINGS["block"],
                               clusters, 0.05)
    return get(name).build(context, **small_params(name))
