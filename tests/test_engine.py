"""The engine against hand-computed numbers and a plain per-client reference loop."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conformance_setup import scan
from conftest import Bound, ragged_dataset
from conftest import algorithm as build
from reference import reference_fedavg_round, reference_local_train

from mcfl.algorithms import AlgorithmContext, get
from mcfl.algorithms.global_model.fedavg import GlobalModelState
from mcfl.algorithms.global_model.fedsgd import fedsgd
from mcfl.data.federated import from_splits
from mcfl.engine import (
    LocalTraining,
    RoundClients,
    Start,
    client_num_steps,
    reduce_blocks,
    train_and_collect,
)
from mcfl.engine.batch_rule import epoch_positions, step_rows
from mcfl.engine.sampling import sample_clients
from mcfl.models import make_model

SIZES = [3, 300, 17, 40, 9, 64]


def _model(data):
    return make_model("mclr", (5,), data.num_classes)


def _training(model, mu=0.0, **kw):
    kw.setdefault("batch_size", 10)
    kw.setdefault("local_epochs", 2)
    return LocalTraining(model.apply, lr=0.05, mu=mu, **kw)


def test_each_epoch_permutes_each_client_and_ignores_other_clients(ragged):
    """The rows a client's steps read over an epoch are each of its rows exactly once, in a
    fresh order every epoch, drawn from its own key: resizing another client changes nothing,
    and the engine's step rule reads exactly `epoch_positions`."""
    data = ragged.arrays
    key = jax.random.key(1)
    offsets, counts = np.asarray(data.train_offsets), np.asarray(data.train_counts)
    rows_of = jax.jit(lambda d, c, s: step_rows(key, d, c, s, 10))
    for client in (0, 1, 4):
        n = int(counts[client])
        steps_per_epoch = -(-n // 10)
        for epoch in range(2):
            read = []
            for s in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch):
                rows, mask = rows_of(data, client, s)
                read += np.asarray(rows)[np.asarray(mask)].tolist()
            np.testing.assert_array_equal(np.sort(read), offsets[client] + np.arange(n))
            positions = np.asarray(epoch_positions(key, client, epoch, n))
            np.testing.assert_array_equal(read, offsets[client] + positions)
    first = np.asarray(epoch_positions(key, 1, 0, 300))
    assert not np.array_equal(first, np.asarray(epoch_positions(key, 1, 1, 300)))
    # Client 1's batches depend on its own key only: resize client 2 and they are unchanged.
    other = ragged_dataset([3, 300, 5, 40, 9, 64]).arrays
    for s in (0, 7, 31):
        a, _ = rows_of(data, 1, s)
        b, _ = rows_of(other, 1, s)
        np.testing.assert_array_equal(np.asarray(a) - offsets[1],
                                      np.asarray(b) - int(other.train_offsets[1]))


def test_training_a_fixed_selection_does_not_depend_on_the_population():
    """The same 3 clients with the same keys train to the same models whether the dataset holds
    100 or 10,000 other clients: a round touches its own clients' rows only."""
    def with_others(num_others):
        rng = np.random.default_rng(0)
        mine = ragged_dataset([23, 7, 41], seed=3)
        sizes = np.concatenate([np.asarray(mine.train_counts()), rng.integers(1, 6, num_others)])
        big = ragged_dataset(sizes, seed=4)
        # put the three clients' own rows in place of the generated ones
        x = np.asarray(big.arrays.x_train).copy()
        y = np.asarray(big.arrays.y_train).copy()
        n = int(mine.train_counts().sum())
        x[:n], y[:n] = np.asarray(mine.arrays.x_train), np.asarray(mine.arrays.y_train)
        return big.arrays.replace(x_train=jnp.asarray(x), y_train=jnp.asarray(y))

    model = make_model("mclr", (5,), 3)
    training = _training(model)
    params = jax.tree.map(lambda p: p[None], model.init(jax.random.key(0)))
    clients = jnp.arange(3, dtype=jnp.int32)
    results = []
    for num_others in (100, 10_000):
        models, stats, _ = train_and_collect(
            Start(params, RoundClients(clients, jnp.zeros_like(clients)), training=training),
            with_others(num_others), jax.random.key(2), block_size=2)
        results.append((models, stats.steps))
    chex.assert_trees_all_equal(results[0], results[1])


def test_each_client_trains_exactly_its_own_steps(ragged):
    """A 3-sample and a 300-sample client: ceil(n/B) steps per epoch each, no more."""
    data = ragged.arrays
    model = _model(ragged)
    training = _training(model)
    params = model.init(jax.random.key(0))
    clients = jnp.arange(6, dtype=jnp.int32)
    key = jax.random.key(3)
    models, stats, _ = train_and_collect(
        Start(jax.tree.map(lambda p: p[None], params),
              RoundClients(clients, jnp.zeros_like(clients)), training=training),
        data, key, block_size=6)
    expected = [2 * -(-n // 10) for n in SIZES]
    np.testing.assert_array_equal(stats.steps, expected)
    np.testing.assert_array_equal(client_num_steps(data.train_counts, training), expected)
    for c in (0, 1):  # the 3-sample and the 300-sample client
        ref, steps = reference_local_train(training, data, key, params, c)
        assert steps == expected[c]
        chex.assert_trees_all_close(jax.tree.map(lambda m, c=c: m[c], models), ref, atol=1e-5)


@pytest.mark.parametrize("mu, block_size", [(0.0, 1), (0.0, 4), (0.0, 6), (0.5, 4)])
def test_fedavg_and_fedprox_match_per_client_loop(ragged, mu, block_size):
    data = ragged.arrays
    model = _model(ragged)
    training = _training(model, mu=mu)
    algorithm = build("fedavg", model, training, 5, block_size)
    state = algorithm.init(data, jax.random.key(0))
    key = jax.random.key(7)
    new_state, metrics = jax.jit(algorithm.round)(state, data, key)

    expected = reference_fedavg_round(training, data, state.params, key, 5)
    chex.assert_trees_all_close(new_state.params, expected, atol=1e-5)
    assert np.isfinite(metrics["train_loss"]) and metrics["discrepancy"] > 0


def test_local_with_fixed_steps_matches_per_client_loop(ragged):
    """Local keeps one model per client; with --local-steps 5 the 3-sample client cycles
    through 5 epochs of its data while the 300-sample one uses 5 batches of one epoch."""
    data = ragged.arrays
    model = _model(ragged)
    training = _training(model, local_steps=5)
    algorithm = build("local", model, training, 4, 3)
    state = algorithm.init(data, jax.random.key(0))
    key = jax.random.key(11)
    new_state, metrics = jax.jit(algorithm.round)(state, data, key)
    assert metrics["local_steps"] == 5

    sample_key, train_key = jax.random.split(key)
    clients = np.asarray(sample_clients(sample_key, 6, 4))
    init = jax.tree.map(lambda p: p[0], state.rows)
    for c in range(6):
        got = jax.tree.map(lambda p, c=c: p[c], new_state.rows)
        if c in clients:
            want, _ = reference_local_train(training, data, train_key, init, c)
        else:
            want = init  # not sampled: untouched
        chex.assert_trees_all_close(got, want, atol=1e-5)


def test_fedavg_with_one_full_batch_step_equals_fedsgd(ragged):
    data = ragged.arrays
    model = _model(ragged)
    training = LocalTraining(model.apply, lr=0.1, batch_size=300, local_steps=1)
    avg = build("fedavg", model, training, 6, 4)
    sgd = Bound(fedsgd(AlgorithmContext(model, 6), chunk=7),
                avg.hp.replace(params=get("fedsgd").params()), 4)
    s_avg = avg.init(data, jax.random.key(0))
    s_sgd = sgd.init(data, jax.random.key(0))
    for r in range(2):
        s_avg, _ = jax.jit(avg.round)(s_avg, data, jax.random.key(r))
        s_sgd, _ = jax.jit(sgd.round)(s_sgd, data, jax.random.key(r))
    chex.assert_trees_all_close(s_avg.params, s_sgd.params, atol=1e-6)


def test_fedavg_hand_computed():
    """Two clients, one feature, two classes, zero initial model, one SGD step (lr 0.1).

    At W = 0 both classes have p = 1/2, so dCE/dlogits = p - onehot(y) = -+1/2.
    Client A (x=1, y=0, n=1): kernel -= 0.1 * 1 * [-1/2, 1/2] -> [0.05, -0.05]; bias the same.
    Client B (x=2, y=1, n=2): kernel -= 0.1 * 2 * [1/2, -1/2] -> [-0.1, 0.1]; bias [-0.05, 0.05].
    Average weighted 1:2 -> kernel [-0.05, 0.05], bias [-1/60, 1/60].
    """
    train = (np.array([[1.0], [2.0], [2.0]], np.float32), np.array([0, 1, 1]), np.array([0, 1, 1]))
    test = (np.array([[1.0], [2.0]], np.float32), np.array([0, 1]), np.array([0, 1]))
    dataset = from_splits("hand", train, test, 2, 2)
    model = make_model("mclr", (1,), 2)
    training = LocalTraining(model.apply, lr=0.1, batch_size=2)
    algorithm = build("fedavg", model, training, 2, 2)
    zeros = jax.tree.map(jnp.zeros_like, model.init(jax.random.key(0)))
    state, metrics = jax.jit(algorithm.round)(
        GlobalModelState(zeros), dataset.arrays, jax.random.key(0)
    )
    np.testing.assert_allclose(state.params["Dense_0"]["kernel"], [[-0.05, 0.05]], atol=1e-7)
    np.testing.assert_allclose(state.params["Dense_0"]["bias"], [-1 / 60, 1 / 60], atol=1e-7)
    np.testing.assert_allclose(metrics["train_loss"], np.log(2), rtol=1e-6)
    # Discrepancy: mean of ||W_A - 0|| = 0.1 and ||W_B - 0|| = sqrt(0.025).
    np.testing.assert_allclose(metrics["discrepancy"], (0.1 + np.sqrt(0.025)) / 2, rtol=1e-6)


@pytest.mark.parametrize("block_size", [1, 3, 10])
def test_reduce_blocks_equals_weighted_segment_sums(block_size):
    rng = np.random.default_rng(0)
    values = rng.normal(size=(10, 4)).astype(np.float32)
    segments = rng.integers(0, 3, 10)
    weights = rng.uniform(0.5, 2, 10).astype(np.float32)
    inputs = {
        "v": jnp.asarray(values),
        "segment": jnp.asarray(segments, jnp.int32),
        "weight": jnp.asarray(weights),
    }
    sums, wsums, (seg, aux) = reduce_blocks(
        lambda b: (b["v"], b["segment"], 2 * b["segment"]), inputs, block_size, 3,
        like=jnp.zeros(4),
    )
    for k in range(3):
        sel = segments == k
        np.testing.assert_allclose(sums[k], (weights[sel, None] * values[sel]).sum(0), rtol=1e-5)
        np.testing.assert_allclose(wsums[k], weights[sel].sum(), rtol=1e-6)
    np.testing.assert_array_equal(seg, segments)
    np.testing.assert_array_equal(aux, 2 * segments)


def test_scanned_rounds_equal_the_round_by_round_loop(ragged):
    data = ragged.arrays
    model = _model(ragged)
    algorithm = build("fedavg", model, _training(model), 4, 2)
    state = algorithm.init(data, jax.random.key(0))
    rounds_key = jax.random.key(3)
    scanned, metrics = scan(algorithm, state, data, rounds_key, 1, 3)
    step = jax.jit(algorithm.round)
    losses = []
    for r in range(1, 4):
        state, m = step(state, data, jax.random.fold_in(rounds_key, r))
        losses.append(float(m["train_loss"]))
    chex.assert_trees_all_close(scanned.params, state.params, atol=1e-6)
    np.testing.assert_allclose(metrics["train_loss"], losses, rtol=1e-5)
