"""``--evaluate-with last_received`` for IFCA and FeSEM (as FedGroup / FlexCFL have it): each
client is evaluated with the model it started its last round from, the one FlexCFL's authors'
code tests a client with, not its cluster's current model."""

from __future__ import annotations

import chex
import jax
import numpy as np
import pytest
from conftest import algorithm as build
from conftest import planted_gaussian, ragged_dataset

import mcfl
from mcfl.engine import LocalTraining
from mcfl.engine.sampling import sample_clients
from mcfl.models import make_model

CLIENTS, PER_ROUND = 6, 2


@pytest.fixture(scope="module")
def tiny():
    data = ragged_dataset([23, 7, 41, 12, 30, 18], seed=5).arrays
    model = make_model("mclr", (5,), 3)
    return data, model, LocalTraining(model.apply, lr=0.1, batch_size=10, local_epochs=1)


def _row(tree, i):
    return jax.tree.map(lambda m: m[i], tree)


@pytest.mark.parametrize("name", ["ifca", "fesem"])
def test_each_client_keeps_the_model_it_started_its_last_round_from(tiny, name):
    data, model, training = tiny
    current = build(name, model, training, PER_ROUND, 2, clusters=2)
    last = build(name, model, training, PER_ROUND, 2, clusters=2,
                 evaluate_with="last_received")
    key = jax.random.key(0)
    state = jax.jit(last.init)(data, key)
    # at the start every client has received its cluster's model
    received, index = last.client_models(state)
    np.testing.assert_array_equal(np.asarray(index), np.arange(CLIENTS))
    for c in range(CLIENTS):
        chex.assert_trees_all_equal(_row(received, c),
                                    _row(state.models, int(state.assignment[c])))

    round_fn, seen = jax.jit(last.round), set()
    for r in range(1, 5):
        round_key = jax.random.key(r)
        clients = np.asarray(sample_clients(jax.random.split(round_key)[0], CLIENTS,
                                            PER_ROUND))
        new_state, _ = round_fn(state, data, round_key)
        # IFCA's clients start from the cluster they join this round; FeSEM's from their center
        start = (new_state.assignment if name == "ifca" else state.assignment)[clients]
        before = last.client_models(state)[0]
        after = last.client_models(new_state)[0]
        for c in range(CLIENTS):
            if c in clients:
                k = int(start[list(clients).index(c)])
                expected = _row(state.models, k)
            else:
                expected = _row(before, c)
            chex.assert_trees_all_equal(_row(after, c), expected)
        seen.update(clients.tolist())
        state = new_state
    # not the clusters' current models: some client's model is stale by now
    stale = [c for c in range(CLIENTS) if not np.array_equal(
        np.asarray(jax.tree.leaves(_row(last.client_models(state)[0], c))[0]),
        np.asarray(jax.tree.leaves(_row(state.models, int(state.assignment[c])))[0]))]
    assert stale, seen
    # training is the same either way: only what a client is evaluated with differs
    other = jax.jit(current.init)(data, key)
    for r in range(1, 5):
        other, _ = jax.jit(current.round)(other, data, jax.random.key(r))
    chex.assert_trees_all_close(other.models, state.models, rtol=1e-6, atol=1e-7)
    models, index = current.client_models(other)
    assert jax.tree.leaves(models)[0].shape[0] == 2 and np.array_equal(index, other.assignment)


def test_a_run_evaluates_ifca_with_last_received_models():
    """Whole runs: the same training, different scores (the stale models score otherwise)."""
    planted, runs = planted_gaussian(40), {}
    for evaluate_with in ("current", "last_received"):
        config = mcfl.RunConfig(algorithm="ifca", clients=40, clients_per_round=8, rounds=6,
                                clusters=4, eval_every=1, seed=1, embed_clients=0,
                                evaluate_with=evaluate_with)
        runs[evaluate_with] = mcfl.run(config, dataset=planted)
    losses = [[row["train_loss"] for row in runs[e].rounds] for e in runs]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
    accuracy = [[row["accuracy_micro"] for row in runs[e].rounds] for e in runs]
    assert accuracy[0] != accuracy[1]
