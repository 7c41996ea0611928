"""Message transforms (`mcfl.transforms`): hand-computed clipping and chaining, the transform's
state carried by a run, every registered algorithm's messages passing through it, and a
clip to 1e-9 leaving the shared models where the start put them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conformance_setup import build_small, planted_data
from conftest import Bound

import mcfl
from mcfl.algorithms import names
from mcfl.errors import ConfigError
from mcfl.transforms import (
    IDENTITY,
    MessageTransform,
    chain,
    clip_updates,
    global_norm,
    scale_updates,
)


def test_clip_updates_by_hand():
    """||(3, 4)|| = 5 clips to 2: (1.2, 1.6); a norm under the bound is kept; the norm is of
    all leaves together: ||(3, 4), (12)|| = 13."""
    clip = clip_updates(2.0)
    np.testing.assert_allclose(clip.client({"a": jnp.array([3.0, 4.0])}, None)["a"],
                               [1.2, 1.6], rtol=1e-6)
    np.testing.assert_allclose(clip.client({"a": jnp.array([0.3, 0.4])}, None)["a"],
                               [0.3, 0.4])
    tree = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([12.0])}
    assert float(global_norm(tree)) == pytest.approx(13.0)
    clipped = clip_updates(6.5).client(tree, None)
    np.testing.assert_allclose(clipped["b"], [6.0], rtol=1e-6)
    assert float(global_norm(clipped)) == pytest.approx(6.5, rel=1e-6)
    for bad in (0, -1.0, float("nan"), "1", True):
        with pytest.raises(ValueError, match="max_norm"):
            clip_updates(bad)


def test_chain_applies_in_order_and_keeps_each_state():
    """scale by 10 then clip to 1 gives norm 1; clip to 1 then scale by 10 gives norm 10;
    the state is the tuple of the parts' states; servers run in order with their own keys."""
    u = {"a": jnp.array([0.3, 0.4])}
    assert float(global_norm(chain(scale_updates(10.0), clip_updates(1.0)).client(
        u, (None, None)))) == pytest.approx(1.0, rel=1e-6)
    assert float(global_norm(chain(clip_updates(1.0), scale_updates(10.0)).client(
        u, (None, None)))) == pytest.approx(5.0, rel=1e-6)
    counting = _counting_server()
    both = chain(clip_updates(1.0), counting, counting)
    assert both.init() == (None, jnp.int32(0), jnp.int32(0))
    sums, totals, state = both.server({"a": jnp.ones((2, 3))}, jnp.ones(2), both.init(),
                                      jax.random.key(0))
    assert [int(s) for s in state[1:]] == [1, 1]
    assert chain().client is None and chain().server is None and not chain().acts
    with pytest.raises(TypeError, match="MessageTransforms"):
        chain(clip_updates(1.0), "clip")


def _counting_server() -> MessageTransform:
    """A server part that leaves the sums and counts its calls in its state."""
    def server(sums, weight_sums, state, key):
        del key
        return sums, weight_sums, state + 1

    return MessageTransform(lambda: jnp.int32(0), None, server)


@pytest.fixture(scope="module")
def data():
    return planted_data().arrays


# Local sends nothing; the others send at least one message a round.
SENDS_NOTHING = {"local"}


@pytest.mark.parametrize("name", names())
def test_every_algorithms_messages_go_through_the_transform(name, data):
    """The round of every registered algorithm, traced with a transform whose client part
    notes that it was traced (inside the round's program) and whose server part counts its
    calls in the transform's state: both reach every algorithm that sends something (Robust,
    whose per-cluster statistic is not a sum, refuses a server part in one line)."""
    traced = []

    def client(message, state):
        traced.append(jax.tree.structure(message))
        return message

    noted = MessageTransform(lambda: jnp.int32(0), client, _counting_server().server)
    bound = build_small(name)
    bound = Bound(bound.algorithm, bound.hp, bound.block_size, transform=noted)
    init_key, round_key = jax.random.split(jax.random.key(0))
    state = jax.jit(bound.init)(data, init_key)
    if name == "robust":
        with pytest.raises(ConfigError, match="robust aggregates each cluster by a median"):
            jax.jit(bound.round)(state, data, round_key)
        return
    new_state, _ = jax.jit(bound.round)(state, data, round_key)
    if name in SENDS_NOTHING:
        assert traced == [] and int(new_state.transform) == 0
    else:
        assert traced, f"{name}'s messages never reached the transform"
        assert int(new_state.transform) >= 1, f"{name} aggregated nothing through it"


@pytest.mark.parametrize("name", ["fedavg", "ifca", "fesem"])
def test_clipping_to_nothing_leaves_the_shared_models_where_the_start_put_them(name):
    """mcfl.run with clip_updates(1e-9): FedAvg's model, IFCA's and FeSEM's cluster models
    stay within 1e-9 of their start (FeSEM's start: the k-means of every client's model), so
    every evaluated round scores the same; without the transform they move."""
    own = {"fesem_restarts": 2} if name == "fesem" else {}
    clustered = {} if name == "fedavg" else {"clusters": 2, "embed_clients": 0}
    config = mcfl.RunConfig(algorithm=name, clients=24, clients_per_round=8, rounds=3,
                            eval_every=1, local_steps=3, lr=0.1, **clustered, **own)
    data = mcfl.load_dataset(config)
    start = mcfl.run(config.replace(rounds=1), dataset=data,
                     transform=clip_updates(1e-9))
    clipped = mcfl.run(config, dataset=data, transform=clip_updates(1e-9))
    free = mcfl.run(config, dataset=data)
    scores = [row["accuracy_micro"] for row in clipped.rounds]
    assert scores == [scores[0]] * len(scores)
    assert [row["accuracy_micro"] for row in free.rounds] != scores

    def models(result):
        state = result.state
        return state.params if name == "fedavg" else state.models

    moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), models(start),
                         models(clipped))
    assert max(jax.tree.leaves(moved)) < 1e-6
    assert clipped.summary["transform"] == "clip_updates(1e-09)"
    assert free.summary["transform"] == IDENTITY.name


def test_a_sweep_takes_a_transform():
    """Members of a sweep run with the transform too: FedAvg's accuracy, clipped to nothing,
    is the same in every round for both seeds."""
    config = mcfl.RunConfig(algorithm="fedavg", clients=16, clients_per_round=4, rounds=2,
                            eval_every=1, local_steps=2, embed_clients=0, lr=0.1)
    result = mcfl.sweep(config, seeds=2, transform=clip_updates(1e-9))
    for member in (0, 1):
        scores = [row["accuracy_micro"] for row in result.rounds if row["member"] == member]
        assert len(scores) == 2 and scores[0] == scores[1]
