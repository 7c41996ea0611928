"""FedGroup / FlexCFL pre-training against a plain per-client loop: the paper's epoch that the
client goes on from (Sec. 3.4), the authors' N steps, the model a client is evaluated with, and
weight decay on kernels only."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import algorithm as build
from conftest import ragged_dataset
from jax.flatten_util import ravel_pytree
from reference import reference_batches

import mcfl
from mcfl.apps.cli import main
from mcfl.engine import LocalTraining, evaluate_counts
from mcfl.engine.sampling import sample_clients
from mcfl.models import make_model

E = 2  # local epochs


@pytest.fixture(scope="module")
def tiny():
    """Three clients of 23, 7 and 41 rows (3, 1 and 5 steps an epoch at B = 10)."""
    data = ragged_dataset([23, 7, 41], seed=3).arrays
    model = make_model("mclr", (5,), 3)
    return data, model, LocalTraining(model.apply, lr=0.1, batch_size=10, local_epochs=E)


@functools.partial(jax.jit, static_argnums=0)
def _sgd_step(apply_fn, params, xb, yb, lr):
    def loss(p):
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(apply_fn(p, xb), yb))

    return jax.tree.map(lambda w, g: w - lr * g, params, jax.grad(loss)(params))


def reference_local_train(training, data, round_key, params, client: int):
    """Plain SGD over the batches the batch rule documents (`reference.reference_batches`),
    one jitted step shared by every call; returns the model and the steps taken."""
    steps = 0
    for xb, yb in reference_batches(training, data, round_key, client):
        params = _sgd_step(training.apply_fn, params, xb, yb, training.lr)
        steps += 1
    return params, steps


def _start(algorithm, model, data, key):
    """The state after the group cold start (one group, one pre-training client), the
    cold-start client and the key its pre-training used (the keys of `fedgroup.init`)."""
    state = jax.jit(algorithm.init)(data, key)
    init_key, pick_key, train_key, _ = jax.random.split(key, 4)
    cold = int(sample_clients(pick_key, data.num_clients, 1)[0])
    chex_equal(state.w0, model.init(init_key))
    return state, cold, train_key


def chex_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-6)


def _mean(models, weights):
    w = np.asarray(weights, np.float64) / np.sum(weights)
    return jax.tree.map(lambda *leaves: sum(wi * leaf for wi, leaf in zip(w, leaves)), *models)


def _flat(params):
    return np.asarray(ravel_pytree(params)[0])


def test_paper_pretraining_is_the_first_of_e_epochs(tiny):
    """The paper (Sec. 3.4): dW is one epoch from W_0 and the client goes on for E - 1 more in
    the same round: E epochs in all, at the group cold start and for a newcomer."""
    data, model, training = tiny
    algorithm = build("fedgroup", model, training, 3, 4, clusters=1, pretrain_scale=1,
                      evaluate_with="last_received")
    key = jax.random.key(0)
    state, cold, train_key = _start(algorithm, model, data, key)
    w0 = state.w0
    one, rest = training.replace(local_epochs=1), training.replace(local_epochs=E - 1)
    pre, _ = reference_local_train(one, data, train_key, w0, cold)
    np.testing.assert_allclose(np.asarray(state.directions[0]), _flat(pre) - _flat(w0),
                               rtol=2e-5, atol=2e-6)
    went_on, _ = reference_local_train(rest, data, jax.random.fold_in(train_key, 1), pre, cold)
    chex_equal(jax.tree.map(lambda m: m[0], state.models), went_on)

    # Round 1: every client; the two outside the group pre-train one epoch and go on.
    group = jax.tree.map(lambda m: m[0], state.models)
    round_key = jax.random.key(1)
    _, cold_key, round_train_key, _ = jax.random.split(round_key, 4)
    new_state, metrics = jax.jit(algorithm.round)(state, data, round_key)
    models, counts = [], np.asarray(data.train_counts)
    for c in range(3):
        if c == cold:
            trained, _ = reference_local_train(training, data, round_train_key, group, c)
        else:
            pre, _ = reference_local_train(one, data, cold_key, w0, c)
            trained, _ = reference_local_train(rest, data, round_train_key, pre, c)
        models.append(trained)
    chex_equal(jax.tree.map(lambda m: m[0], new_state.models), _mean(models, counts))
    epoch_steps = -(-counts // 10)
    assert float(metrics["local_steps"]) == pytest.approx(np.mean(E * epoch_steps))  # not E + 1
    # 3 clients: a newcomer downloads W_0 (no group model) and uploads dW and its model; the
    # cold-start client (round 1 counts it) downloaded W_0 and uploaded dW and its model.
    assert float(metrics["models_down"]) == 3 + 1
    assert float(metrics["models_up"]) == 3 + 2 + 2
    # Evaluated with the model each started the round from: W_0 for the newcomers.
    received, index = algorithm.client_models(new_state)
    np.testing.assert_array_equal(np.asarray(index), [0, 1, 2])
    for c in range(3):
        chex_equal(jax.tree.map(lambda m, c=c: m[c], received), group if c == cold else w0)


def test_paper_newcomers_joining_as_updates_add_their_update_to_the_group_model(tiny):
    """--newcomer-join update: a newcomer that went on from its pre-training epoch enters its
    group's weighted mean as w_g + (w_i - W_0), a member as its model w_i."""
    data, model, training = tiny
    algorithm = build("fedgroup", model, training, 3, 4, clusters=1, pretrain_scale=1,
                      newcomer_join="update")
    state, cold, _ = _start(algorithm, model, data, jax.random.key(0))
    group, w0 = jax.tree.map(lambda m: m[0], state.models), state.w0
    one, rest = training.replace(local_epochs=1), training.replace(local_epochs=E - 1)
    round_key = jax.random.key(1)
    _, cold_key, round_train_key, _ = jax.random.split(round_key, 4)
    new_state, _ = jax.jit(algorithm.round)(state, data, round_key)
    joined = []
    for c in range(3):
        if c == cold:
            trained, _ = reference_local_train(training, data, round_train_key, group, c)
            joined.append(trained)
        else:
            pre, _ = reference_local_train(one, data, cold_key, w0, c)
            trained, _ = reference_local_train(rest, data, round_train_key, pre, c)
            joined.append(jax.tree.map(lambda g, t, w: g + t - w, group, trained, w0))
    chex_equal(jax.tree.map(lambda m: m[0], new_state.models),
               _mean(joined, np.asarray(data.train_counts)))


def test_authors_pretraining_is_n_steps_then_a_round_from_the_group(tiny):
    """--pretrain-steps 3 (the authors' code): dW is 3 SGD steps from W_0 (the 7-row client
    cycles through 3 epochs of 1 step), the group's model their mean pre-trained model, and a
    newcomer then trains its E epochs from its group's model."""
    data, model, training = tiny
    algorithm = build("fedgroup", model, training, 3, 4, clusters=1, pretrain_scale=1,
                      pretrain_steps=3, evaluate_with="last_received")
    key = jax.random.key(0)
    state, cold, train_key = _start(algorithm, model, data, key)
    w0 = state.w0
    three = training.replace(local_steps=3)
    pre, steps = reference_local_train(three, data, train_key, w0, cold)
    assert steps == 3
    np.testing.assert_allclose(np.asarray(state.directions[0]), _flat(pre) - _flat(w0),
                               rtol=2e-5, atol=2e-6)
    chex_equal(jax.tree.map(lambda m: m[0], state.models), pre)

    group = jax.tree.map(lambda m: m[0], state.models)
    round_fn = jax.jit(algorithm.round)
    round_key = jax.random.key(1)
    _, _, round_train_key, _ = jax.random.split(round_key, 4)
    state1, metrics = round_fn(state, data, round_key)
    counts = np.asarray(data.train_counts)
    models = [reference_local_train(training, data, round_train_key, group, c)[0]
              for c in range(3)]
    chex_equal(jax.tree.map(lambda m: m[0], state1.models), _mean(models, counts))
    newcomer = np.arange(3) != cold
    assert float(metrics["local_steps"]) == pytest.approx(
        np.mean(E * -(-counts // 10) + 3 * newcomer))
    assert float(metrics["models_down"]) == float(metrics["models_up"]) == 3 + 2 + 1

    # After a round where the group's model changed, each client is evaluated with the model
    # it received (the group's before round 2), not the group's current one.
    state2, _ = round_fn(state1, data, jax.random.key(2))
    received, index = algorithm.client_models(state2)
    for c in range(3):
        chex_equal(jax.tree.map(lambda m, c=c: m[c], received),
                   jax.tree.map(lambda m: m[0], state1.models))
    current = jax.tree.map(lambda m: m[0], state2.models)
    assert np.abs(_flat(current) - _flat(jax.tree.map(lambda m: m[0], received))).max() > 1e-3
    stale = evaluate_counts(model.apply, data, received, index, 4)
    now = evaluate_counts(model.apply, data, state2.models, jnp.zeros(3, jnp.int32), 4)
    assert not np.allclose(np.asarray(stale.loss_sum), np.asarray(now.loss_sum))


def test_weight_decay_on_kernels_leaves_biases_alone(tiny):
    """The authors' L2 on the kernel only: with zero gradients an SGD step moves each kernel
    by -lr * wd * W and leaves the biases as they were; "all" decays both."""
    _, model, training = tiny
    params = jax.tree.map(lambda p: p + 1.0, model.init(jax.random.key(0)))  # bias != 0
    zeros = jax.tree.map(jnp.zeros_like, params)
    moved = {}
    for on in ("kernels", "all"):
        opt = training.replace(weight_decay=0.5, weight_decay_on=on).transform()
        updates, _ = opt.update(zeros, opt.init(params), params)
        moved[on] = optax.apply_updates(params, updates)["Dense_0"]
    p = params["Dense_0"]
    np.testing.assert_allclose(moved["kernels"]["kernel"], p["kernel"] * (1 - 0.1 * 0.5),
                               rtol=1e-6)
    np.testing.assert_array_equal(moved["kernels"]["bias"], p["bias"])
    np.testing.assert_allclose(moved["all"]["bias"], p["bias"] * (1 - 0.1 * 0.5), rtol=1e-6)
    config = mcfl.RunConfig(weight_decay=0.002, weight_decay_on="kernels")
    chosen = mcfl.resolve(config).local_training(model)
    assert chosen.weight_decay_on == "kernels" and not chosen.plain_sgd  # not the fast paths


@pytest.mark.parametrize("argv, message", [
    (["--pretrain-steps", "-3"], "pretrain_steps must be an integer >= 1, got -3"),
    (["--pretrain", "half"], "unknown pretrain 'half'; allowed: epoch, full"),
    (["--pretrain", "full", "--pretrain-steps", "50"], "give it or pretrain=full, not both"),
    (["--evaluate-with", "old"], "unknown evaluate_with 'old'; allowed: current, last_received"),
    (["--weight-decay-on", "bias"], "unknown weight_decay_on 'bias'; allowed: all, kernels"),
    (["--newcomer-join", "update", "--pretrain-steps", "50"],
     "newcomer_join=update needs the paper's pre-training"),
])
def test_bad_pretraining_settings_are_one_line_exit_2(argv, message, capsys):
    try:
        code = main(["run", "--algorithm", "flexcfl", "--clients", "40", "--clusters", "2",
                     *argv])
    except SystemExit as e:  # argparse's own type errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
