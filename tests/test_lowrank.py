"""The factored (low-rank) local SGD path equals per-client training, to float rounding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ragged_dataset
from reference import reference_local_train

import mcfl
from mcfl import engine
from mcfl.config import RunConfig
from mcfl.engine import FastPaths, LocalTraining, RoundClients, lowrank
from mcfl.errors import ConfigError
from mcfl.models import make_model
from mcfl.runs.runner import run

SIZES = [3, 31, 17, 40, 9, 24, 12]  # partial last batches, one client shorter than a batch
LR = 0.1


@pytest.fixture(scope="module")
def setup():
    data = ragged_dataset(SIZES, num_features=20, num_classes=5, seed=3).arrays
    model = make_model("mlp", (20,), 5, hidden=(16, 12))
    return data, model


def training(model, mode, mu=0.0, epochs=2, steps=None, batch=4):
    return LocalTraining(model.apply, batch_size=batch, lr=LR, local_epochs=epochs,
                         local_steps=steps, mu=mu,
                         fast=FastPaths(model.dense_layers, low_rank=mode))


def max_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in
               zip(jax.tree.leaves(a), jax.tree.leaves(b)))


_DENSE_RESULTS: dict = {}


@pytest.mark.parametrize("num_models,mu,steps,unroll", [
    (1, 0.0, None, 0),  # the plain case in the loop
    (1, 0.5, None, 64),  # the unrolled schedule, with the proximal pull
    (3, 0.3, 5, 0),  # several start models, fixed steps, the pull, in the loop
], ids=["loop", "prox-unrolled", "models-prox-steps-loop"])
def test_low_rank_equals_dense_path(setup, num_models, mu, steps, unroll, monkeypatch):
    """Collected models, per-client stats and segment sums agree with the per-client path for
    one shared start model (summed in the block), several start models, FedProx's pull with a
    per-client weight (FeSEM), epochs and fixed step counts; with the steps in a loop over
    full-capacity buffers and unrolled over a triangular history."""
    monkeypatch.setattr(lowrank, "UNROLL_STEPS", unroll)
    jax.clear_caches()  # the threshold is read when tracing
    data, model = setup
    c = len(SIZES)
    models = jax.vmap(model.init)(jax.random.split(jax.random.key(0), num_models))
    start = jnp.arange(c, dtype=jnp.int32) % num_models
    selection = RoundClients(jnp.arange(c, dtype=jnp.int32), start)
    prox_scale = jnp.linspace(0.5, 2.0, c)
    weights = jnp.asarray(SIZES, jnp.float32)
    def results(mode):
        t = training(model, mode, mu=mu, steps=steps, batch=8)  # at most 10 steps
        key = jax.random.key(1)
        begun = engine.Start(models, selection, weights, start, num_models, training=t,
                             prox_scale=prox_scale)
        return (jax.jit(lambda: engine.train_and_collect(begun, data, key, block_size=3))(),
                jax.jit(lambda: engine.train_and_aggregate(begun, data, key, block_size=3))())

    # the per-client path does not depend on the threshold: computed once per case
    case = (num_models, mu, steps)
    if case not in _DENSE_RESULTS:
        _DENSE_RESULTS[case] = results("off")
    out = {"off": _DENSE_RESULTS[case], "on": results("on")}
    assert max_diff(out["off"][0][0], out["on"][0][0]) < 2e-5  # models
    dense_stats, factored_stats = out["off"][0][1], out["on"][0][1]
    np.testing.assert_array_equal(dense_stats.steps, factored_stats.steps)
    np.testing.assert_allclose(dense_stats.loss, factored_stats.loss, rtol=1e-5)
    np.testing.assert_allclose(dense_stats.update_norm, factored_stats.update_norm, rtol=1e-4)
    np.testing.assert_allclose(dense_stats.sq_norm, factored_stats.sq_norm, rtol=1e-5)
    assert max_diff(out["off"][1][0], out["on"][1][0]) < 1e-4  # weighted segment sums


def test_low_rank_equals_plain_per_client_loop(setup):
    """The factored path against the plain Python loop of jitted SGD steps (tests/reference)."""
    data, model = setup
    params = model.init(jax.random.key(2))
    t = training(model, "on", epochs=3)
    key = jax.random.key(5)
    c = len(SIZES)
    selection = RoundClients(jnp.arange(c, dtype=jnp.int32), jnp.zeros(c, jnp.int32))
    trained, stats, _ = engine.train_and_collect(
        engine.Start(jax.tree.map(lambda x: x[None], params), selection, training=t),
        data, key, block_size=4)
    for client in (0, 1, 4):
        expected, steps = reference_local_train(t, data, key, params, client)
        assert int(stats.steps[client]) == steps
        assert max_diff(jax.tree.map(lambda x, c=client: x[c], trained), expected) < 2e-5


def test_auto_takes_the_factored_path_only_where_it_is_cheaper():
    mlp = [(784, 200), (200, 200), (200, 10)]
    assert lowrank.worth_low_rank(50, mlp)  # the 5 steps of B = 10
    assert not lowrank.worth_low_rank(500, mlp)  # long local training: per-client kernels
    assert not lowrank.worth_low_rank(10, [(60, 10)])  # MCLR never
    model = make_model("mlp", (784,), 10)
    data = ragged_dataset([50, 50], num_features=784, num_classes=10).arrays
    stacked = jax.eval_shape(jax.vmap(model.init), jax.random.split(jax.random.key(0), 1))
    assert engine.low_rank_capacity(training(model, "auto", epochs=1, batch=10), data,
                                    stacked) == 5
    assert engine.low_rank_capacity(training(model, "off", epochs=1, batch=10), data,
                                    stacked) is None
    adam = training(model, "auto", epochs=1, batch=10).replace(optimizer="adam")
    assert engine.low_rank_capacity(adam, data, stacked) is None


def test_low_rank_on_needs_plain_sgd():
    with pytest.raises(ConfigError, match="--low-rank on needs plain SGD"):
        mcfl.resolve(RunConfig(model="cnn-fmnist", weight_decay=0.1, low_rank="on"))
    with pytest.raises(ConfigError, match="got --client-optimizer momentum"):
        mcfl.resolve(RunConfig(model="mlp", client_optimizer="momentum", low_rank="on"))
    with pytest.raises(ConfigError, match="unknown low_rank .yes.; allowed: auto, on, off"):
        RunConfig(low_rank="yes")


def test_a_fedprox_run_is_the_same_on_both_paths():
    config = RunConfig(algorithm="fedprox", mu=0.1, dataset="synthetic", clients=12, rounds=2,
                       model="mlp", hidden=(16,), local_steps=3, clients_per_round=6)
    dense = run(config.replace(low_rank="off"))
    factored = run(config.replace(low_rank="on"))
    assert factored.summary["low_rank"] and not dense.summary["low_rank"]
    assert max_diff(dense.state.params, factored.state.params) < 1e-5
    for a, b in zip(dense.rounds, factored.rounds):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        assert a["accuracy_micro"] == pytest.approx(b["accuracy_micro"], abs=1e-6)


@pytest.mark.parametrize("block_size,mu,steps", [(1, 0.0, None), (3, 0.4, None), (2, 0.0, 7)])
def test_factored_cnn_layer_equals_the_per_client_path(block_size, mu, steps):
    """The CNN trained with its hidden dense kernel kept as factors (`local_train_factored`)
    gives the same models and stats as plain per-client training: blocks of one (no mask) and
    of several clients (masked steps), FedProx's pull with per-client weights, epochs and a
    fixed step count."""
    sizes = [7, 23, 12, 30, 5]
    data = ragged_dataset(sizes, num_features=64, num_classes=4, seed=5).arrays
    model = make_model("cnn-fmnist", (8, 8), 4, conv="matmul")  # 8 x 8 images: small kernels
    assert model.factored is not None and model.dense_layers is None
    common = dict(local_epochs=2, local_steps=steps, mu=mu)
    dense = LocalTraining(model.apply, batch_size=4, lr=LR,
                          fast=FastPaths(factored=model.factored, low_rank="off"), **common)
    factored = dense.replace(fast=dense.fast._replace(low_rank="on"))
    models = jax.vmap(model.init)(jax.random.split(jax.random.key(1), 2))
    c = len(sizes)
    selection = RoundClients(jnp.arange(c, dtype=jnp.int32), jnp.arange(c, dtype=jnp.int32) % 2)
    prox_scale = jnp.linspace(0.5, 2.0, c)
    key = jax.random.key(4)
    assert engine.low_rank_capacity(factored, data, models) is not None
    out = [jax.jit(lambda t=t: engine.train_and_collect(
        engine.Start(models, selection, training=t, prox_scale=prox_scale),
        data, key, block_size=block_size))()
           for t in (dense, factored)]
    assert max_diff(out[0][0], out[1][0]) < 2e-5
    np.testing.assert_array_equal(out[0][1].steps, out[1][1].steps)
    np.testing.assert_allclose(out[0][1].loss, out[1][1].loss, rtol=1e-5)
    np.testing.assert_allclose(out[0][1].update_norm, out[1][1].update_norm, rtol=1e-4)


def test_block_size_rule_by_backend_and_path():
    """The rule's hand-computed sizes for the MLP 784-200-200-10 (199,210 parameters): on a
    GPU the low-rank path takes up to 2^30 bytes of parameters' worth a block (capped at
    1,024 clients), the per-client path 2^28 (336); on CPU 50 and 2^22 bytes (5)."""
    params = 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10
    assert params == 199_210
    rule = engine.default_block_size
    assert rule(params, 1000, backend="gpu", low_rank=True) == 1000  # 2^30 / (4 * params) = 1347
    assert rule(params, 5000, backend="gpu", low_rank=True) == 1024
    assert rule(params, 1000, backend="gpu") == 336  # 2^28 / (4 * params)
    assert rule(params, 1000, backend="cpu", low_rank=True) == 50
    assert rule(params, 1000, backend="cpu") == 5  # 2^22 / (4 * params)
    assert rule(params, 3, backend="gpu", low_rank=True) == 3  # never above the round's clients
    # every client training the same steps: no block wastes one, so up to 128 small models
    # (MCLR 60 -> 10: 610 parameters) within the same 2^22 bytes; the MLP stays at 5
    assert rule(610, 100, backend="cpu", uniform_steps=True) == 100
    assert rule(610, 1000, backend="cpu", uniform_steps=True) == 128
    assert rule(610, 1000, backend="cpu") == 8
    assert rule(params, 1000, backend="cpu", uniform_steps=True) == 5
    assert rule(params, 1000, backend="cpu", low_rank=True, uniform_steps=True) == 50
