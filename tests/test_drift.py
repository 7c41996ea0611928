"""The client-drift baselines (SCAFFOLD, FedNova) against plain per-client loops on ragged
clients, whose step counts differ (what both algorithms correct for)."""

from __future__ import annotations

import chex
import jax
import numpy as np
import pytest
from conftest import algorithm as build

from mcfl.engine import LocalTraining
from mcfl.engine.sampling import sample_clients
from mcfl.errors import ConfigError
from mcfl.models import make_model
from tests.reference import reference_local_train


def _weighted(weights, trees):
    return jax.tree.map(lambda *leaves: sum(w * x for w, x in zip(weights, leaves)), *trees)


def _coefficient_sum(steps: int, optimizer: str, rho: float, shrink: float) -> float:
    """||a||_1 by its definition: the summed coefficients of the `steps` local gradients in
    the client's update (heavy-ball momentum: sum_j<steps-k rho^j for gradient k; a proximal
    pull: (1 - eta mu)^(steps - 1 - k))."""
    total = 0.0
    for k in range(steps):
        if optimizer == "momentum":
            total += sum(rho ** j for j in range(steps - k))
        else:
            total += (1.0 - shrink) ** (steps - 1 - k)
    return total


@pytest.mark.parametrize("optimizer, mu", [("sgd", 0.0), ("momentum", 0.0), ("sgd", 0.5)])
def test_fednova_steps_by_normalised_updates_as_a_per_client_loop(ragged, optimizer, mu):
    """x <- x - tau_eff sum_i p_i (x - y_i) / ||a_i||_1 (Wang et al. 2020, Eq. 6-7), two rounds,
    4 of 6 clients of 3 to 300 rows (1 to 60 local steps)."""
    data = ragged.arrays
    model = make_model("mclr", (5,), 3)
    training = LocalTraining(model.apply, lr=0.05, batch_size=10, local_epochs=2,
                             optimizer=optimizer, momentum=0.5)
    algorithm = build("fednova", model, training, 4, 3, fednova_mu=mu)
    state = algorithm.init(data, jax.random.key(0))
    x = state.params
    client_training = training.replace(mu=mu) if mu > 0 else training
    step = jax.jit(algorithm.round)
    for r in range(2):
        key = jax.random.key(20 + r)
        state, metrics = step(state, data, key)
        sample_key, train_key = jax.random.split(key)
        clients = np.asarray(sample_clients(sample_key, 6, 4))
        counts = np.asarray(data.train_counts)[clients].astype(np.float64)
        p = counts / counts.sum()
        trained, a = [], []
        for c in clients:
            y, steps = reference_local_train(client_training, data, train_key, x, int(c))
            trained.append(y)
            a.append(_coefficient_sum(steps, optimizer, 0.5, 0.05 * mu))
        a = np.asarray(a)
        tau_eff = float(np.sum(p * a))
        step_tree = _weighted(p / a, [jax.tree.map(lambda u, v: u - v, x, y) for y in trained])
        x = jax.tree.map(lambda u, d, t=tau_eff: u - t * d, x, step_tree)
        chex.assert_trees_all_close(state.params, x, atol=2e-5)
        np.testing.assert_allclose(metrics["tau_eff"], tau_eff, rtol=1e-5)


def test_fednova_refuses_an_optimizer_whose_coefficients_it_does_not_know():
    import mcfl

    with pytest.raises(ConfigError, match="client_optimizer=adam"):
        mcfl.resolve(mcfl.RunConfig(algorithm="fednova", client_optimizer="adam"))
    with pytest.raises(ConfigError, match="either momentum or fednova_mu"):
        mcfl.resolve(mcfl.RunConfig(algorithm="fednova", client_optimizer="momentum",
                                    fednova_mu=0.1))
    with pytest.raises(ConfigError, match="client_optimizer=momentum"):
        mcfl.resolve(mcfl.RunConfig(algorithm="scaffold", client_optimizer="momentum"))


def test_scaffold_control_variates_as_a_per_client_loop(ragged):
    """Karimireddy et al. 2020, Alg. 1, option II, three rounds of 3 of 6 ragged clients:
    gradients corrected by c - c_i, c_i <- c_i - c + (x - y_i) / (K_i eta), x moved by the mean
    of y_i - x, c by the sum of the variates' changes over N."""
    data = ragged.arrays
    model = make_model("mclr", (5,), 3)
    training = LocalTraining(model.apply, lr=0.05, batch_size=10, local_epochs=1)
    algorithm = build("scaffold", model, training, 3, 2, server_lr=0.8)
    state = algorithm.init(data, jax.random.key(1))
    x = state.algorithm[0]
    zero = jax.tree.map(np.zeros_like, x)
    c, ci = zero, [zero] * 6
    step = jax.jit(algorithm.round)
    for r in range(3):
        key = jax.random.key(30 + r)
        state, _ = step(state, data, key)
        sample_key, train_key = jax.random.split(key)
        clients = np.asarray(sample_clients(sample_key, 6, 3))
        ys, new_c = [], list(ci)
        for k in clients:
            correction = jax.tree.map(lambda g, own: g - own, c, ci[k])
            y, steps = reference_local_train(training, data, train_key, x, int(k),
                                             correction=correction)
            ys.append(y)
            new_c[k] = jax.tree.map(lambda own, g, u, v, s=steps: own - g + (u - v) / (s * 0.05),
                                    ci[k], c, x, y)
        x = jax.tree.map(lambda u, *y: u + 0.8 * np.mean([v - u for v in y], axis=0), x, *ys)
        c = jax.tree.map(lambda g, *pairs: g + sum(pairs) / 6, c,
                         *[jax.tree.map(lambda a, b: a - b, new_c[k], ci[k]) for k in clients])
        ci = new_c
        chex.assert_trees_all_close(state.algorithm[0], x, atol=2e-5)
        chex.assert_trees_all_close(state.algorithm[1], c, atol=2e-4)
        for k in range(6):
            chex.assert_trees_all_close(jax.tree.map(lambda t, k=k: t[k], state.rows), ci[k],
                                        atol=2e-4)


def test_fednova_coefficients_of_a_tiny_proximal_pull_are_the_step_counts():
    """(1 - (1 - eta mu)^tau) / (eta mu) tends to tau as eta mu -> 0; in float32 the direct
    form loses it below eta mu ~ 6e-8 (1 - eta mu rounds to 1)."""
    from mcfl.algorithms.global_model.fednova import gradient_weight

    model = make_model("mclr", (5,), 3)
    steps = jax.numpy.asarray([1, 7, 60])
    for mu in (1e-7, 1e-3):
        training = LocalTraining(model.apply, lr=0.05, batch_size=10, mu=mu)
        want = [(1 - (1 - 0.05 * mu) ** t) / (0.05 * mu) for t in (1, 7, 60)]  # float64
        np.testing.assert_allclose(gradient_weight(steps, training), want, rtol=1e-5)


def test_a_sweep_over_fednova_mu_is_one_program():
    """fednova_mu is a traced number: a grid over it runs as one group, each member as its
    own run."""
    import mcfl

    config = mcfl.RunConfig(algorithm="fednova", clients=12, clients_per_round=4, rounds=2,
                            eval_every=2, embed_clients=0)
    result = mcfl.sweep(config, seeds=[0], grid={"fednova_mu": [0.0, 0.1]})
    assert len(result.groups) == 1 and result.groups[0]["traced"] == ["fednova_mu"]
    single = mcfl.run(config.replace(fednova_mu=0.1))
    np.testing.assert_allclose(result.members[1]["final_accuracy_micro"],
                               single.summary["final_accuracy_micro"], atol=1e-6)
