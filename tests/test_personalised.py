"""Partial personalisation (FedPer, LG-FedAvg): each client's own layers and the averaged shared
ones equal a plain per-client loop; a layer count the model cannot split is one clear error."""

from __future__ import annotations

import chex
import jax
import numpy as np
import optax
import pytest
from conftest import algorithm as build

from mcfl.algorithms.framework.device import evaluation_counts
from mcfl.engine import LocalTraining, evaluate_clients
from mcfl.engine.sampling import sample_clients
from mcfl.errors import ConfigError
from mcfl.models import make_model
from tests.reference import client_train_rows, reference_batches, reference_local_train

# (algorithm, its layer-count key, the own layers of MLP 5-8-6-3 it gives for count 1)
SPLITS = {"fedper": ("layers", {"Dense_2"}), "lg_fedavg": ("local_layers", {"Dense_0"})}


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_own_layers_stay_and_shared_layers_average_as_a_per_client_loop(ragged, name):
    """Two rounds, 4 of 6 ragged clients each: a sampled client trains the server's shared
    layers with its own (W_0's the first time); the shared layers become the n_i-weighted mean
    of the trained ones; only the sampled clients' own layers change."""
    data = ragged.arrays
    model = make_model("mlp", (5,), 3, hidden=(8, 6))
    training = LocalTraining(model.apply, lr=0.05, batch_size=10, local_epochs=2)
    key_name, own = SPLITS[name]
    algorithm = build(name, model, training, 4, 3, **{key_name: 1})
    state = algorithm.init(data, jax.random.key(0))
    w0 = jax.tree.map(lambda x: x, {**state.algorithm[0], **state.algorithm[1]})
    assert set(state.algorithm[1]) == own and set(state.algorithm[0]) | own == set(w0)
    shared = {k: v for k, v in w0.items() if k not in own}
    rows = [{k: w0[k] for k in own} for _ in range(6)]
    step = jax.jit(algorithm.round)
    for r in range(2):
        key = jax.random.key(10 + r)
        state, _ = step(state, data, key)
        sample_key, train_key = jax.random.split(key)
        clients = np.asarray(sample_clients(sample_key, 6, 4))
        trained = {}
        for c in clients:
            trained[c], _ = reference_local_train(training, data, train_key,
                                                  {**shared, **rows[c]}, int(c))
        weights = np.asarray(data.train_counts)[clients].astype(np.float32)
        weights /= weights.sum()
        shared = {k: jax.tree.map(lambda *leaves, w=weights: sum(a * x for a, x in zip(w, leaves)),
                                  *[trained[c][k] for c in clients]) for k in shared}
        for c in clients:
            rows[c] = {k: trained[c][k] for k in own}
        chex.assert_trees_all_close(state.algorithm[0], shared, atol=1e-5)
        for c in range(6):
            chex.assert_trees_all_close(jax.tree.map(lambda x, c=c: x[c], state.rows), rows[c],
                                        atol=1e-5)
    # evaluated with the shared layers and its own
    models, index = algorithm.client_models(state)
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[index[2]], models),
                                {**shared, **rows[2]}, atol=1e-5)


def test_a_layer_count_the_model_cannot_split_is_one_clear_error(ragged):
    model = make_model("mlp", (5,), 3, hidden=(8,))
    training = LocalTraining(model.apply, lr=0.05, batch_size=10)
    algorithm = build("fedper", model, training, 4, 3, layers=2)
    with pytest.raises(ConfigError, match=r"^fedper_layers=2: model 'mlp' has 2 layers "
                       r"\(Dense_0, Dense_1\); allowed: 1 \(a client's own; the rest are "
                       r"shared\)$"):
        algorithm.init(ragged.arrays, jax.random.key(0))


ONE_LAYER_NEEDS = {
    "fedper": "fedper needs a model with base layers to share and personalisation layers to keep",
    "lg_fedavg": "lg_fedavg needs a model with local layers to keep and global layers to share",
    "fedrep": "fedrep needs a model with a body and a head",
}


@pytest.mark.parametrize("name", sorted(ONE_LAYER_NEEDS))
def test_a_one_layer_model_is_refused_naming_what_the_algorithm_needs(ragged, name):
    """The default model, MCLR, has one layer: the message says what the algorithm needs and
    which model has it, not an empty range of layer counts."""
    model = make_model("mclr", (5,), 3)
    algorithm = build(name, model, LocalTraining(model.apply, lr=0.05, batch_size=10), 4, 3)
    with pytest.raises(ConfigError) as caught:
        algorithm.init(ragged.arrays, jax.random.key(0))
    assert str(caught.value) == (f"{ONE_LAYER_NEEDS[name]} (at least two layers), e.g. --model "
                                 f"mlp; 'mclr' has one (Dense_0)")


def test_ditto_global_and_personal_models_as_a_per_client_loop(ragged):
    """Ditto (Li et al. 2021, Alg. 1), two rounds of 4 of 6 ragged clients: w by FedAvg; each
    sampled client's personal model v_k trains from where it left off (W_0 at first) on
    F_k(v) + (lambda/2)||v - w^t||^2 with the round's w^t; evaluated with v_k."""
    data = ragged.arrays
    model = make_model("mclr", (5,), 3)
    training = LocalTraining(model.apply, lr=0.05, batch_size=10, local_epochs=2)
    algorithm = build("ditto", model, training, 4, 3, ditto_lambda=0.5)
    state = algorithm.init(data, jax.random.key(2))
    w = state.algorithm[0]
    personal = [w] * 6
    step = jax.jit(algorithm.round)
    for r in range(2):
        key = jax.random.key(40 + r)
        state, _ = step(state, data, key)
        sample_key, train_key = jax.random.split(key)
        global_key, personal_key = jax.random.split(train_key)
        clients = np.asarray(sample_clients(sample_key, 6, 4))
        counts = np.asarray(data.train_counts)[clients].astype(np.float64)
        trained = [reference_local_train(training, data, global_key, w, int(c))[0]
                   for c in clients]
        for c in clients:
            personal[c], _ = reference_local_train(training.replace(mu=0.5), data, personal_key,
                                                   personal[c], int(c), anchor=w)
        share = counts / counts.sum()
        w = jax.tree.map(lambda *leaves, s=share: sum(p * x for p, x in zip(s, leaves)), *trained)
        chex.assert_trees_all_close(state.algorithm[0], w, atol=2e-5)
        for c in range(6):
            chex.assert_trees_all_close(jax.tree.map(lambda x, c=c: x[c], state.rows),
                                        personal[c], atol=2e-5)
    models, index = algorithm.client_models(state)
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[index[3]], models), personal[3],
                                atol=2e-5)


def _ce(model):
    """Mean cross-entropy of `model` on a batch, and its gradient (jitted)."""
    loss = jax.jit(lambda p, x, y: optax.softmax_cross_entropy_with_integer_labels(
        model.apply(p, x), y).mean())
    return loss, jax.jit(jax.grad(lambda p, x, y: loss(p, x, y)))


def _sub(a, b, scale=1.0):
    return jax.tree.map(lambda u, v: u - scale * v, a, b)


def test_apfl_mixtures_as_a_per_client_loop(ragged):
    """APFL (Deng et al. 2020, Alg. 1, adaptive alpha), two rounds of 3 of 6 ragged clients,
    written out step by step: w <- w - eta grad f(w); v <- v - eta alpha grad f(v_bar);
    alpha <- alpha - eta <v - w, grad f(v_bar)>; the server averages w by n_i."""
    data = ragged.arrays
    model = make_model("mclr", (5,), 3)
    training = LocalTraining(model.apply, lr=0.1, batch_size=10, local_epochs=1)
    algorithm = build("apfl", model, training, 3, 3, apfl_alpha=0.4)
    state = algorithm.init(data, jax.random.key(3))
    _, grad = _ce(model)
    w = state.algorithm[0]
    v, alpha = [w] * 6, [0.4] * 6
    step = jax.jit(algorithm.round)
    for r in range(2):
        key = jax.random.key(50 + r)
        state, _ = step(state, data, key)
        sample_key, train_key = jax.random.split(key)
        clients = np.asarray(sample_clients(sample_key, 6, 3))
        trained_w = []
        for c in clients:
            wc, vc, a = w, v[c], alpha[c]
            for xb, yb in reference_batches(training, data, train_key, int(c)):
                mixed = jax.tree.map(lambda p, q, a=a: a * p + (1 - a) * q, vc, wc)
                g_mixed, g_w = grad(mixed, xb, yb), grad(wc, xb, yb)
                g_alpha = sum(float(np.sum((p - q) * g)) for p, q, g in zip(
                    jax.tree.leaves(vc), jax.tree.leaves(wc), jax.tree.leaves(g_mixed)))
                vc = _sub(vc, g_mixed, 0.1 * a)
                wc = _sub(wc, g_w, 0.1)
                a = a - 0.1 * g_alpha
            trained_w.append(wc)
            v[c], alpha[c] = vc, min(max(a, 0.0), 1.0)
        share = np.asarray(data.train_counts)[clients] / np.sum(
            np.asarray(data.train_counts)[clients])
        w = jax.tree.map(lambda *x, s=share: sum(p * u for p, u in zip(s, x)), *trained_w)
        chex.assert_trees_all_close(state.algorithm[0], w, atol=2e-5)
        np.testing.assert_allclose(state.rows[1], alpha, atol=2e-5)
        for c in range(6):
            chex.assert_trees_all_close(jax.tree.map(lambda x, c=c: x[c], state.rows[0]), v[c],
                                        atol=2e-5)
    models, index = algorithm.client_models(state)
    want = jax.tree.map(lambda p, q: alpha[1] * p + (1 - alpha[1]) * q, v[1], w)
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[index[1]], models), want, atol=2e-5)


def test_fedrep_head_then_body_as_a_per_client_loop(ragged):
    """FedRep (Collins et al. 2021, Alg. 1), two rounds of 3 of 6 clients on MLP 5-8-3: the
    client's head trains 2 epochs with the body fixed, then the body 1 epoch with the new head
    fixed; bodies averaged by n_i, heads kept."""
    data = ragged.arrays
    model = make_model("mlp", (5,), 3, hidden=(8,))
    training = LocalTraining(model.apply, lr=0.1, batch_size=10, local_epochs=1)
    algorithm = build("fedrep", model, training, 3, 3, fedrep_head_epochs=2)
    state = algorithm.init(data, jax.random.key(4))
    _, grad = _ce(model)
    body = state.algorithm[0]
    heads = [state.algorithm[1]] * 6
    assert set(body) == {"Dense_0"} and set(heads[0]) == {"Dense_1"}
    step = jax.jit(algorithm.round)
    for r in range(2):
        key = jax.random.key(60 + r)
        state, _ = step(state, data, key)
        sample_key, train_key = jax.random.split(key)
        head_key, body_key = jax.random.split(train_key)
        clients = np.asarray(sample_clients(sample_key, 6, 3))
        bodies = []
        for c in clients:
            b, h = body, heads[c]
            for xb, yb in reference_batches(training.replace(local_epochs=2), data, head_key,
                                            int(c)):
                h = _sub(h, {"Dense_1": grad({**b, **h}, xb, yb)["Dense_1"]}, 0.1)
            for xb, yb in reference_batches(training, data, body_key, int(c)):
                b = _sub(b, {"Dense_0": grad({**b, **h}, xb, yb)["Dense_0"]}, 0.1)
            heads[c] = h
            bodies.append(b)
        share = np.asarray(data.train_counts)[clients] / np.sum(
            np.asarray(data.train_counts)[clients])
        body = jax.tree.map(lambda *x, s=share: sum(p * u for p, u in zip(s, x)), *bodies)
        chex.assert_trees_all_close(state.algorithm[0], body, atol=2e-5)
        for c in range(6):
            chex.assert_trees_all_close(jax.tree.map(lambda x, c=c: x[c], state.rows),
                                        heads[c], atol=2e-5)


def test_pfedme_personal_and_local_models_as_a_per_client_loop(ragged):
    """pFedMe (Dinh et al. 2020, Alg. 1), two rounds of 3 of 6 clients: per batch, K = 3
    gradient steps on f(theta) + (lambda/2)||theta - w||^2 from theta, then
    w <- w - eta lambda (w - theta); server (1 - beta) w + beta * mean w_i."""
    data = ragged.arrays
    model = make_model("mclr", (5,), 3)
    training = LocalTraining(model.apply, lr=0.05, batch_size=10, local_epochs=1)
    algorithm = build("pfedme", model, training, 3, 3, pfedme_lambda=2.0,
                      pfedme_personal_lr=0.1, pfedme_inner_steps=3, pfedme_beta=1.5)
    state = algorithm.init(data, jax.random.key(5))
    _, grad = _ce(model)
    w = state.algorithm[0]
    theta = [w] * 6
    step = jax.jit(algorithm.round)
    for r in range(2):
        key = jax.random.key(70 + r)
        state, _ = step(state, data, key)
        sample_key, train_key = jax.random.split(key)
        clients = np.asarray(sample_clients(sample_key, 6, 3))
        locals_ = []
        for c in clients:
            wc, t = w, w
            for xb, yb in reference_batches(training, data, train_key, int(c)):
                for _ in range(3):
                    g = grad(t, xb, yb)
                    t = jax.tree.map(lambda p, gp, q: p - 0.1 * (gp + 2.0 * (p - q)), t, g, wc)
                wc = jax.tree.map(lambda p, q: p - 0.05 * 2.0 * (p - q), wc, t)
            theta[c] = t
            locals_.append(wc)
        w = jax.tree.map(lambda g, *x: -0.5 * g + 1.5 * np.mean(x, axis=0), w, *locals_)
        chex.assert_trees_all_close(state.algorithm[0], w, atol=2e-5)
        for c in range(6):
            chex.assert_trees_all_close(jax.tree.map(lambda x, c=c: x[c], state.rows),
                                        theta[c], atol=2e-5)


def _posteriors(per_row, components, x, y, log_pi, prior=None):
    """[K, n] q_im ∝ pi_m exp(-loss_m(x_i, y_i)) (/ prior[m, y_i], FedRC), in numpy."""
    logits = np.stack([log_pi[m] - np.asarray(per_row(p, x, y))
                       for m, p in enumerate(components)])
    if prior is not None:
        logits = logits - np.log(prior[:, np.asarray(y)])
    q = np.exp(logits - logits.max(0))
    return q / q.sum(0)


@pytest.mark.parametrize("name", ["fedem", "fedrc"])
def test_fedem_and_fedrc_em_steps_and_mixtures_as_a_per_client_loop(ragged, name):
    """FedEM (Marfoq et al. 2021, Alg. 2), two rounds of 3 of 6 ragged clients, K = 2 MCLR
    components, written out: the E-step posteriors q_im ∝ pi_m exp(-loss_m(x_i, y_i)) from the
    round's components, pi <- their mean over the client's rows, each component's SGD on the
    q-weighted loss of each batch; components averaged by n_t; evaluated with the mixture
    log sum_m pi_m softmax(f_m(x)); the hard cluster is argmax pi. FedRC (Guo et al. 2024)
    divides q_im by P_m(y_i): every client's soft label counts sum_i q_im [y_i = y] (1/3 each
    before it trains), summed, floored at 1e-8, normalised over the labels."""
    from mcfl.algorithms.clustered.fedem import mixture_apply
    from mcfl.algorithms.framework.stored import evaluated_floats

    data = ragged.arrays
    model = make_model("mclr", (5,), 3)
    training = LocalTraining(model.apply, lr=0.1, batch_size=10, local_epochs=2)
    algorithm = build(name, model, training, 3, 3, clusters=2)
    state = algorithm.init(data, jax.random.key(5))
    theta = [jax.tree.map(lambda x, m=m: x[m], state.algorithm.components) for m in range(2)]
    pi = np.full((6, 2), 0.5)
    labels = np.full((6, 2, 3), 1 / 3)  # FedRC's soft label counts
    per_row = jax.jit(lambda p, x, y: optax.softmax_cross_entropy_with_integer_labels(
        model.apply(p, x), y))
    weighted_grad = jax.jit(jax.grad(lambda p, q, x, y: jax.numpy.sum(q * per_row(p, x, y))
                                     / y.shape[0]))
    step = jax.jit(algorithm.round)
    for r in range(2):
        key = jax.random.key(70 + r)
        state, _ = step(state, data, key)
        sample_key, train_key = jax.random.split(key)
        clients = np.asarray(sample_clients(sample_key, 6, 3))
        totals = np.maximum(labels.sum(0), 1e-8)
        prior = totals / totals.sum(1, keepdims=True) if name == "fedrc" else None
        trained = []
        for c in clients:
            x, y = client_train_rows(data, int(c))

            log_pi = np.log(pi[c])
            q_all = _posteriors(per_row, theta, x, y, log_pi, prior)
            new_pi = q_all.mean(1)
            labels[c] = q_all @ np.eye(3)[np.asarray(y)]
            local = list(theta)
            for xb, yb in reference_batches(training, data, train_key, int(c)):
                q = _posteriors(per_row, theta, xb, yb, log_pi, prior)
                for m in range(2):
                    local[m] = _sub(local[m], weighted_grad(local[m], q[m], xb, yb), 0.1)
            trained.append(local)
            pi[c] = new_pi
        share = np.asarray(data.train_counts)[clients] / np.sum(
            np.asarray(data.train_counts)[clients])
        theta = [jax.tree.map(lambda *x, s=share: sum(p * u for p, u in zip(s, x)),
                              *[t[m] for t in trained]) for m in range(2)]
        for m in range(2):
            chex.assert_trees_all_close(
                jax.tree.map(lambda x, m=m: x[m], state.algorithm.components), theta[m], atol=2e-5)
        if name == "fedrc":
            np.testing.assert_allclose(state.rows[0], pi, atol=2e-5)
            np.testing.assert_allclose(state.rows[1], labels, atol=1e-4)
            np.testing.assert_allclose(state.algorithm.label_totals, labels.sum(0), rtol=1e-5)
        else:
            np.testing.assert_allclose(state.rows, pi, atol=2e-5)
    np.testing.assert_array_equal(algorithm.assignments(state),
                                  np.where(pi[:, 1] > pi[:, 0], 1, 0))
    models, index = algorithm.client_models(state)
    # Evaluation chunks count a client's evaluated mixture (2 MCLRs of 18 weights, 2 log-pis),
    # not its row (2 or 8 numbers): 3,000 Fashion-MNIST clients held 8.2 GB of them at once.
    assert evaluated_floats(algorithm.client_state, state.algorithm) == 2 * 18 + 2
    x = data.x_test[:7]
    got = mixture_apply(model.apply)(jax.tree.map(lambda v: v[index[4]], models), x)
    probs = sum(pi[4, m] * jax.nn.softmax(model.apply(theta[m], x)) for m in range(2))
    np.testing.assert_allclose(jax.nn.softmax(got), probs, atol=1e-5)


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_maml_steps_and_personalised_models_as_a_per_client_loop(ragged, variant):
    """Per-FedAvg (Fallah et al. 2020, Alg. 1), two rounds of 3 of 6 ragged clients, written
    out: each batch split into D, D' (, D'') by rows in turn; w~ = w - alpha grad f(w; D);
    FO: w -= beta grad f(w~; D'); HF: w -= beta (g - alpha H_D''(w) g), g = grad f(w~; D'),
    with H g by forward-over-reverse; the plain mean of the clients' models; each client
    evaluated with w - alpha grad f_i(w) on all its rows."""
    data = ragged.arrays
    model = make_model("mclr", (5,), 3)
    training = LocalTraining(model.apply, lr=0.1, batch_size=10, local_epochs=1)
    algorithm = build("perfedavg", model, training, 3, 3, perfedavg_alpha=0.3,
                      perfedavg_variant=variant)
    state = algorithm.init(data, jax.random.key(6))
    _, grad = _ce(model)
    parts = 2 if variant == "fo" else 3

    def mean_grad(w, x, y):  # grad of the mean over no rows is 0
        return grad(w, x, y) if len(y) else jax.tree.map(np.zeros_like, w)

    w = state.params
    step = jax.jit(algorithm.round)
    for r in range(2):
        key = jax.random.key(80 + r)
        state, _ = step(state, data, key)
        sample_key, train_key = jax.random.split(key)
        clients = np.asarray(sample_clients(sample_key, 6, 3))
        trained = []
        for c in clients:
            wc = w
            for xb, yb in reference_batches(training, data, train_key, int(c)):
                sets = [(xb[j::parts], yb[j::parts]) for j in range(parts)]
                adapted = _sub(wc, mean_grad(wc, *sets[0]), 0.3)
                g = mean_grad(adapted, *sets[1])
                if variant == "hf" and len(sets[2][1]):
                    _, hg = jax.jvp(lambda p, d=sets[2]: grad(p, *d), (wc,), (g,))
                    g = _sub(g, hg, 0.3)
                wc = _sub(wc, g, 0.1)
            trained.append(wc)
        w = jax.tree.map(lambda *x: sum(x) / len(x), *trained)
        chex.assert_trees_all_close(state.params, w, atol=2e-5)
    chosen = jax.numpy.asarray([1, 4], jax.numpy.int32)
    personal = algorithm.described(state, data).of_clients(chosen)
    for i, c in enumerate([1, 4]):
        want = _sub(w, grad(w, *client_train_rows(data, c)), 0.3)
        chex.assert_trees_all_close(jax.tree.map(lambda x, i=i: x[i], personal), want,
                                    atol=2e-5)
    # a run's evaluation is with these models
    everyone = jax.numpy.arange(6, dtype=jax.numpy.int32)
    counts, _ = evaluation_counts(algorithm.algorithm, model.apply, 3,
                                  algorithm.device_state(state), data)
    chex.assert_trees_all_close(counts, evaluate_clients(
        model.apply, data, algorithm.described(state, data).of_clients(everyone), everyone, 3))


def test_fedsoft_importance_weights_proximal_updates_and_centers_as_a_per_client_loop(ragged):
    """FedSoft (Ruan and Joe-Wong 2022, Alg. 1), three rounds of 3 of 6 ragged clients, K = 2
    MCLR centers, weights estimated every 2 rounds (before rounds 1 and 3), written out: u_ks =
    max(n_ks / n_k, sigma) renormalised, n_ks the rows center s fits best; a sampled client
    trains its local model (c_bar_k = sum_s u_ks c_s the first time) with the pull
    (lambda/2) ||w - c_bar_k||^2, whose gradient is that of (lambda/2) sum_s u_ks ||w - c_s||^2;
    center s: the u_ks n_k-weighted mean of the round's local models; a client is evaluated
    with its local model, or c_bar_k before it trains."""
    data = ragged.arrays
    model = make_model("mclr", (5,), 3)
    training = LocalTraining(model.apply, lr=0.1, batch_size=10, local_epochs=1)
    algorithm = build("fedsoft", model, training, 3, 3, clusters=2, fedsoft_lambda=0.5,
                      fedsoft_interval=2, fedsoft_smoother=0.05)
    state = algorithm.init(data, jax.random.key(7))
    centers = [jax.tree.map(lambda x, s=s: x[s], state.algorithm.centers) for s in range(2)]
    per_row = jax.jit(lambda p, x, y: optax.softmax_cross_entropy_with_integer_labels(
        model.apply(p, x), y))
    counts = np.asarray(data.train_counts)
    u = np.full((6, 2), 0.5)
    local = [None] * 6

    def mix(weights):
        return jax.tree.map(lambda a, b: weights[0] * a + weights[1] * b, *centers)

    step = jax.jit(algorithm.round)
    for r in range(3):
        if r % 2 == 0:
            for c in range(6):
                x, y = client_train_rows(data, c)
                losses = np.stack([per_row(p, x, y) for p in centers])
                share = np.bincount(np.argmin(losses, 0), minlength=2) / len(y)
                u[c] = np.maximum(share, 0.05) / np.maximum(share, 0.05).sum()
        key = jax.random.key(90 + r)
        state, _ = step(state, data, key)
        sample_key, train_key = jax.random.split(key)
        clients = np.asarray(sample_clients(sample_key, 6, 3))
        for c in clients:
            anchor = mix(u[c])
            start = anchor if local[c] is None else local[c]
            local[c], _ = reference_local_train(training.replace(mu=0.5), data, train_key,
                                                start, int(c), anchor=anchor)
        weights = u[clients] * counts[clients][:, None]
        shares = weights / weights.sum(0)
        centers = [jax.tree.map(lambda *x, a=shares[:, s]: sum(w * v for w, v in zip(a, x)),
                                *[local[c] for c in clients]) for s in range(2)]
        for s in range(2):
            chex.assert_trees_all_close(jax.tree.map(lambda x, s=s: x[s], state.algorithm.centers),
                                        centers[s], atol=2e-5)
        np.testing.assert_allclose(state.algorithm.weights, u, atol=1e-6)
    models, index = algorithm.client_models(state)
    for c in range(6):
        want = mix(u[c]) if local[c] is None else local[c]
        chex.assert_trees_all_close(jax.tree.map(lambda x, c=c: x[index[c]], models), want,
                                    atol=2e-5)
    np.testing.assert_array_equal(algorithm.assignments(state), np.argmax(u, 1))


def _flat(params):
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(params)])


def test_stocfl_representations_merges_slots_and_models_as_a_per_client_loop(ragged):
    """StoCFL (Zeng et al. 2023, as its authors' code runs it), three rounds of 3 of 6 ragged
    clients, K = 1 slot (clusters compete for it), written out: psi = anchor - anchor after 2
    full-batch gradient steps (first time sampled); sampled clusters' mean psi joined when
    their cosine >= tau
    (transitively, named by the smallest id); a merged cluster keeps its largest part's slot,
    others take free slots largest first (from the global model); each client trains its
    cluster's model pulled toward the global one and the global model; plain means."""
    data = ragged.arrays
    model = make_model("mclr", (5,), 3)
    training = LocalTraining(model.apply, lr=0.1, batch_size=10, local_epochs=1)
    tau, mu = 0.2, 0.3
    algorithm = build("stocfl", model, training, 3, 3, clusters=1, stocfl_tau=tau,
                      stocfl_mu=mu, stocfl_observe_epochs=2)
    state = algorithm.init(data, jax.random.key(8))
    shared = state.algorithm
    glob, anchor = shared.global_model, shared.anchor
    slots = [jax.tree.map(lambda x, k=k: x[k], shared.slots) for k in range(1)]
    used, cluster_of, slot_of = [False], np.arange(6), np.full(6, -1)
    psi = {}
    _, grad = _ce(model)
    step = jax.jit(algorithm.round)
    merges = 0
    for r in range(3):
        key = jax.random.key(100 + r)
        state, _ = step(state, data, key)
        sample_key, rest = jax.random.split(key)
        train_key, global_key = jax.random.split(rest)
        clients = np.asarray(sample_clients(sample_key, 6, 3))
        for c in clients:
            if c not in psi:
                a = anchor
                for _ in range(2):
                    a = _sub(a, grad(a, *client_train_rows(data, int(c))), 0.1)
                psi[c] = _flat(anchor) - _flat(a)
        old = cluster_of[clients]
        directions = np.stack([np.mean([psi[d] for d, o in zip(clients, old) if o == root], 0)
                               for root in old])
        unit = directions / np.linalg.norm(directions, axis=1, keepdims=True)
        linked = (unit @ unit.T >= tau) | (old[:, None] == old[None, :])
        names = old.copy()
        for _ in range(3):
            names = np.array([names[linked[i]].min() for i in range(3)])
        merges += len(set(old)) - len(set(names))
        part_sizes = np.bincount(cluster_of, minlength=6)
        cluster_of = np.array([dict(zip(old, names)).get(o, o) for o in cluster_of])
        merged_sizes = np.bincount(cluster_of, minlength=6)
        kept = {}
        for o, new in zip(old, names):
            if slot_of[o] >= 0:
                best = kept.get(new)
                if best is None or (part_sizes[o], slot_of[o]) > best[0]:
                    kept[new] = ((part_sizes[o], slot_of[o]), slot_of[o])
                used[slot_of[o]] = False
        for o in old:
            slot_of[o] = -1
        for new, (_, s) in kept.items():
            slot_of[new], used[s] = s, True
        for i in sorted(range(3), key=lambda i: -merged_sizes[names[i]]):
            if slot_of[names[i]] < 0 and not all(used):
                free = used.index(False)
                slot_of[names[i]], used[free] = free, True
                slots[free] = glob
        trained_clusters, trained_globals = {}, []
        for c, root in zip(clients, names):
            start = slots[slot_of[root]] if slot_of[root] >= 0 else glob
            w, _ = reference_local_train(training.replace(mu=mu), data, train_key, start,
                                         int(c), anchor=glob)
            if slot_of[root] >= 0:
                trained_clusters.setdefault(slot_of[root], []).append(w)
            g, _ = reference_local_train(training, data, global_key, glob, int(c))
            trained_globals.append(g)
        glob = jax.tree.map(lambda *x: sum(x) / len(x), *trained_globals)
        for k, ws in trained_clusters.items():
            slots[k] = jax.tree.map(lambda *x: sum(x) / len(x), *ws)
        chex.assert_trees_all_close(state.algorithm.global_model, glob, atol=2e-5)
        np.testing.assert_array_equal(state.algorithm.cluster_of, cluster_of)
        np.testing.assert_array_equal(state.algorithm.slot_of, slot_of)
        np.testing.assert_array_equal(state.algorithm.used, used)
        for k in range(len(used)):
            if used[k]:
                chex.assert_trees_all_close(
                    jax.tree.map(lambda x, k=k: x[k], state.algorithm.slots), slots[k], atol=2e-5)
        for c in clients:
            np.testing.assert_allclose(np.asarray(state.rows)[c], psi[c], atol=1e-5)
    assert merges >= 1
    np.testing.assert_array_equal(algorithm.assignments(state), slot_of[cluster_of])
