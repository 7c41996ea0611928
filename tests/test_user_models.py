"""A user's own flax module through mcfl: the checks on the data's shapes, the registry and
import paths, the train mode (per-client, per-step dropout keys; BatchNorm statistics as part
of each client's model, aggregated or kept local as FedBN does) against a plain per-client
loop, and the fast paths found by structure against the generic path."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import Bound, ragged_dataset

import mcfl
from mcfl.algorithms import get
from mcfl.algorithms.wrappers.local_norm import with_local_norm
from mcfl.apps.cli import main
from mcfl.engine import (
    FastPaths,
    LocalTraining,
    RoundClients,
    Start,
    train_and_aggregate,
    train_and_collect,
)
from mcfl.engine.batch_rule import step_rows
from mcfl.engine.training import dropout_key, masked_cross_entropy
from mcfl.errors import ConfigError
from mcfl.models import make_model, register
from mcfl.models.spec import local_part
from mcfl.models.structure import find_dense_stack

OWN_MODEL_PAGE = Path(__file__).parent.parent / "docs" / "guide" / "models.md"


class NormNet(nn.Module):
    """Dense -> BatchNorm -> ReLU -> Dropout -> Dense: a train mode and mutable state."""

    classes: int = 3

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dense(8)(x.reshape((x.shape[0], -1)))
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.5)(x))
        x = nn.Dropout(0.5, deterministic=not train)(x)
        return nn.Dense(self.classes)(x)


class NamedMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(6, name="hidden")(x))
        return nn.Dense(3, name="logits")(x)


class TanhMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.tanh(nn.Dense(6)(x.reshape((x.shape[0], -1)))))


class ConvStack(nn.Module):
    """'SAME' convolutions at strides 1 and 2 (computed as matmuls on CPU) and a 'VALID' one
    (left to XLA)."""

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], 6, 6, 1))
        x = nn.relu(nn.Conv(3, (3, 3))(x))
        x = nn.relu(nn.Conv(4, (3, 3), strides=2)(x))
        x = nn.relu(nn.Conv(2, (2, 2), padding="VALID")(x))
        return nn.Dense(3)(x.reshape((x.shape[0], -1)))


@pytest.fixture(scope="module")
def data():
    return ragged_dataset([7, 12, 5, 9], num_features=5).arrays


def test_a_module_that_does_not_fit_the_data_is_one_line():
    class Wrong(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(4)(x)

    class Breaks(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(x.reshape((x.shape[0], 7, 7)))

    with pytest.raises(ConfigError, match=r"maps inputs \(2, 5\) to \(2, 4\); it must give "
                                          r"logits of shape \(2, 3\)"):
        make_model(Wrong(), (5,), 3)
    with pytest.raises(ConfigError, match=r"model 'Breaks' fails on inputs of shape \(2, 5\) "
                                          r"\(the data's feature shape \(5,\)\): TypeError"):
        make_model(Breaks(), (5,), 3)

    class Stateful(nn.Module):  # batch norm without a train keyword
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(nn.BatchNorm(use_running_average=True)(x))

    with pytest.raises(ConfigError, match="takes no 'train' keyword"):
        make_model(Stateful(), (5,), 3)
    with pytest.raises(ConfigError, match=r"^model '<lambda>': its factory returned str; a "
                                          r"model factory must return a flax.linen.Module"):
        make_model(lambda shape, classes: "not a module", (5,), 3)
    with pytest.raises(ConfigError, match="must be a flax.linen.Module"):
        mcfl.models.from_module("not a module", (5,), 3)


def test_registry_and_import_paths(tmp_path, monkeypatch):
    @register("test-tiny-mlp")
    def tiny(feature_shape, num_classes, width: int = 4):
        return mcfl.models.MLP((width,), num_classes)

    assert make_model("test-tiny-mlp", (5,), 3, model_args={"width": 7}).init(
        jax.random.key(0))["Dense_0"]["kernel"].shape == (5, 7)
    with pytest.raises(ValueError, match="already registered"):
        register("test-tiny-mlp")(lambda s, c: None)
    with pytest.raises(ConfigError, match=r"takes no argument\(s\) depth"):
        make_model("test-tiny-mlp", (5,), 3, model_args={"depth": 2})
    with pytest.raises(ConfigError, match="unknown model 'nope'; allowed: mclr, mlp"):
        mcfl.RunConfig(model="nope")

    (tmp_path / "usernets.py").write_text(textwrap.dedent("""
        import flax.linen as nn

        class Net(nn.Module):
            num_classes: int
            width: int = 5

            @nn.compact
            def __call__(self, x):
                return nn.Dense(self.num_classes)(nn.relu(nn.Dense(self.width)(x)))

        def factory(feature_shape, num_classes, width=3):
            return Net(num_classes, width)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    by_class = make_model("usernets:Net", (5,), 3, model_args={"width": 2})
    # (the inner layer is made second: Dense_1; the chain follows the shapes, not the names)
    assert by_class.init(jax.random.key(0))["Dense_1"]["kernel"].shape == (5, 2)
    assert make_model("usernets:factory", (5,), 3).dense_layers == ("Dense_1", "Dense_0")
    with pytest.raises(ConfigError, match="module 'usernets' has no attribute 'Nope'"):
        mcfl.RunConfig(model="usernets:Nope")
    with pytest.raises(ConfigError, match=r"cannot import 'no_such_pkg.nets' \(No module named"):
        mcfl.RunConfig(model="no_such_pkg.nets:Net")


def test_cli_runs_a_model_by_import_path_and_refuses_a_bad_one(tmp_path, monkeypatch, capsys):
    (tmp_path / "clinets.py").write_text(textwrap.dedent("""
        import flax.linen as nn

        def good(feature_shape, num_classes):
            return nn.Dense(num_classes)

        def bad(feature_shape, num_classes):
            return nn.Dense(num_classes + 1)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    common = ["run", "--clients", "4", "--rounds", "1", "--synthetic-beta", "0.5"]
    assert main(common + ["--model", "clinets:good", "--out", str(tmp_path / "run")]) == 0
    summary = (tmp_path / "run" / "summary.json").read_text()
    assert '"model": "clinets:good"' in summary
    assert main(common + ["--model", "clinets:bad"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("mcfl: error: model 'clinets:bad' maps inputs (2, 60) to (2, 11); it must "
                       "give logits of shape (2, 10): one per class of the data")


# ----------------------------------------------------------------------------------------------
# A user's model that fails anywhere before round 1: one line naming it and the mode


class IntLogits(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(x).astype(jnp.int32)


class ComplexLogits(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(x).astype(jnp.complex64)


class FailsInTraining(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        if train:
            raise ValueError("boom in training")
        return nn.Dense(10)(x)


class FailsInEvaluation(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        if not train:
            raise ValueError("boom in evaluation")
        return nn.Dense(10)(x)


class WantsAnotherKey(nn.Module):
    """Noise from a PRNG stream of its own in training: mcfl gives only 'dropout'."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        logits = nn.Dense(10)(x)
        if train:
            logits = logits + jax.random.normal(self.make_rng("noise"), logits.shape)
        return logits


@jax.custom_vjp
def _no_gradient(x):
    return x


def _refuse_gradient(residuals, g):
    raise ValueError("no gradient through here")


_no_gradient.defvjp(lambda x: (x, None), _refuse_gradient)


class FailsUnderGrad(nn.Module):
    """Evaluates, but its gradient raises (a custom rule that refuses)."""

    @nn.compact
    def __call__(self, x):
        return _no_gradient(nn.Dense(10)(x))


class NanLogits(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(x) * jnp.nan


class NanInTraining(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        logits = nn.Dense(10)(x)
        return jnp.log(logits - logits) if train else logits  # log 0 = -inf


def broken_factory(feature_shape, num_classes, width=4):
    raise RuntimeError("factory boom")


def not_a_model_factory(feature_shape, num_classes):
    return {"layers": 2}


TRAINING = "called with train=True and a 'dropout' PRNG key, "
BAD_MODELS = [
    (IntLogits(), "model 'IntLogits' returns int32 logits; it must return floating-point logits "
     "[batch, classes] (cross-entropy and its gradient need real numbers)"),
    (ComplexLogits(), "model 'ComplexLogits' returns complex64 logits; it must return "
     "floating-point logits [batch, classes]"),
    (FailsInTraining(), f"model 'FailsInTraining' fails in training mode ({TRAINING}vmapped "
     f"over clients): ValueError: boom in training"),
    (FailsInEvaluation(), "model 'FailsInEvaluation' fails in evaluation mode (train=False) on "
     "inputs of shape (2, 60) (the data's feature shape (60,)): ValueError: boom in evaluation"),
    (WantsAnotherKey(), f"model 'WantsAnotherKey' fails in training mode ({TRAINING}vmapped over "
     f"clients): InvalidRngError: "),
    (FailsUnderGrad(), "model 'FailsUnderGrad' fails in training mode (differentiated in its "
     "parameters and vmapped over clients): ValueError: no gradient through here"),
    (NanLogits(), "model 'NanLogits' gives non-finite logits (NaN or infinity) on the first "
     "batch (10 training rows, at its initial parameters, in evaluation mode)"),
    (NanInTraining(), "model 'NanInTraining' gives non-finite logits (NaN or infinity) on the "
     "first batch (10 training rows, at its initial parameters, in training mode)"),
    (broken_factory, "model 'broken_factory' could not be built: RuntimeError: factory boom"),
    (not_a_model_factory, "model 'not_a_model_factory': its factory returned dict; a model "
     "factory must return a flax.linen.Module whose __call__(x) gives logits"),
]


@pytest.mark.parametrize("model, message", BAD_MODELS,
                         ids=[getattr(m, "__name__", type(m).__name__) for m, _ in BAD_MODELS])
def test_a_model_that_fails_before_round_one_is_one_line_and_leaves_no_folder(
        model, message, tmp_path):
    """Through `mcfl.run`: a `ConfigError` starting with the message (naming the model, the
    mode and the error), raised before the run folder is made."""
    config = mcfl.RunConfig(clients=4, rounds=1, synthetic_beta=0.5, embed_clients=0)
    with pytest.raises(ConfigError) as caught:
        mcfl.run(config, model=model, out_dir=tmp_path / "run")
    text = str(caught.value)
    assert text.startswith(message) and "\n" not in text
    assert not (tmp_path / "run").exists()
    if isinstance(model, WantsAnotherKey):
        assert text.endswith("; mcfl gives a model one PRNG stream, 'dropout', and only in "
                             "local steps, where it calls a model whose __call__ takes `train` "
                             "with train=True")


def test_the_mode_checks_are_abstract_and_pass_good_models():
    """`make_model` traces a user's model in both modes without compiling (a model that trains
    with dropout and batch norm passes); mcfl's own registered models are not traced again;
    a factory's arguments are named when it fails with them."""
    assert make_model(NormNet(), (5,), 3).takes_train
    with pytest.raises(ConfigError, match=r"^model 'broken_factory' could not be built with "
                                          r"\{'width': 3\}: RuntimeError: factory boom$"):
        make_model(broken_factory, (5,), 3, model_args={"width": 3})

    class AlwaysDropout(nn.Module):  # dropout at evaluation too: no key is given there
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(nn.Dropout(0.5, deterministic=False)(x))

    with pytest.raises(ConfigError, match=r"^model 'AlwaysDropout' fails on inputs of shape "
                                          r"\(2, 5\) .*InvalidRngError: .*; mcfl gives a model "
                                          r"one PRNG stream, 'dropout', and only in local steps"):
        make_model(AlwaysDropout(), (5,), 3)
    from mcfl.models.build import is_users

    assert not is_users("mlp") and not is_users("cnn-cifar")
    assert is_users(NormNet()) and is_users(broken_factory) and is_users("usernets:Net")


BAD_MODULE = """
import flax.linen as nn
import jax.numpy as jnp


def int_logits(feature_shape, num_classes):
    return IntNet(num_classes)


class IntNet(nn.Module):
    classes: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.classes)(x).astype(jnp.int32)


class TrainBoom(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        if train:
            raise ValueError("boom")
        return nn.Dense(10)(x)


class NanNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(x) / 0.0 * 0.0


def raises(feature_shape, num_classes):
    raise KeyError("depth")
"""


def test_cli_refuses_a_failing_model_in_one_line_and_exit_code_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "clibad.py").write_text(textwrap.dedent(BAD_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    common = ["run", "--clients", "4", "--rounds", "1", "--synthetic-beta", "0.5",
              "--embed-clients", "0"]
    expected = {
        "clibad:int_logits": "model 'clibad:int_logits' returns int32 logits; it must return "
                             "floating-point logits [batch, classes]",
        "clibad:TrainBoom": f"model 'clibad:TrainBoom' fails in training mode ({TRAINING}"
                            f"vmapped over clients): ValueError: boom",
        "clibad:raises": "model 'clibad:raises' could not be built: KeyError: 'depth'",
    }
    for name, message in expected.items():
        out = tmp_path / name.replace(":", "-")
        assert main(common + ["--model", name, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and err.startswith(f"mcfl: error: {message}"), err
        assert not out.exists()
    # the last check (real values of one batch), from a process of its own: one line, no
    # traceback, no folder
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path),
                                                        os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "nan-run"
    proc = subprocess.run([sys.executable, "-m", "mcfl", *common, "--no-compile-cache",
                           "--model", "clibad:NanNet", "--out", str(out)],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert proc.stderr.startswith("mcfl: error: model 'clibad:NanNet' gives non-finite logits "
                                  "(NaN or infinity) on the first batch")
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not out.exists()


def _reference_client(model, data, key, start, client, steps, lr, batch):
    """One client's local SGD written out: train=True, the engine's dropout key and batch of
    each step, gradients of the parameters only, the batch statistics replaced each step."""
    variables = jax.tree.map(jnp.asarray, start)
    for s in range(steps):
        rows, mask = step_rows(key, data, client, s, batch)

        def loss(params, stats, rows=rows, mask=mask, s=s):
            logits, updates = model.module.apply(
                {"params": params, "batch_stats": stats}, data.x_train[rows], train=True,
                rngs={"dropout": dropout_key(key, client, s)}, mutable=["batch_stats"])
            return masked_cross_entropy(logits, data.y_train[rows], mask), updates

        grads, updates = jax.grad(loss, has_aux=True)(variables["params"],
                                                      variables["batch_stats"])
        variables = {"params": optax.apply_updates(
            variables["params"], jax.tree.map(lambda g: -lr * g, grads)),
            "batch_stats": updates["batch_stats"]}
    return variables


def test_train_mode_equals_a_per_client_loop_and_statistics_are_averaged(data):
    model = make_model(NormNet(), (5,), 3)
    assert model.collections == ("batch_stats",) and model.takes_train
    training = LocalTraining(model.apply, batch_size=4, lr=0.1, local_steps=3,
                             train_apply=model.train_apply, collections=model.collections)
    start = model.init(jax.random.key(1))
    stacked = jax.tree.map(lambda p: p[None], start)
    key = jax.random.key(7)
    clients = jnp.array([0, 1, 3], jnp.int32)
    selection = RoundClients(clients, jnp.zeros(3, jnp.int32))
    trained, stats, _ = jax.jit(lambda: train_and_collect(
        Start(stacked, selection, training=training),
        data, key, block_size=2))()
    expected = [_reference_client(model, data, key, start, int(c), 3, 0.1, 4) for c in clients]
    for i in range(3):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
                     jax.tree.map(lambda m, i=i: m[i], trained), expected[i])
    assert np.all(np.asarray(stats.steps) == 3)
    # different clients drew different dropout masks and batches: their statistics differ
    means = np.asarray(trained["batch_stats"]["BatchNorm_0"]["mean"])
    assert not np.allclose(means[0], means[1])
    # FedAvg's sum: the statistics are averaged with the parameters, by training rows
    weights = data.train_counts[clients].astype(jnp.float32)
    sums, weight_sums, _, _, _ = jax.jit(lambda: train_and_aggregate(
        Start(stacked, selection, weights, jnp.zeros(3, jnp.int32), 1, training=training),
        data, key, block_size=2))()
    mean = jax.tree.map(lambda s: s[0] / weight_sums[0], sums)
    w = np.asarray(weights) / np.asarray(weights).sum()
    expected_mean = jax.tree.map(lambda *leaves: sum(wi * leaf for wi, leaf in zip(w, leaves)),
                                 *expected)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
                 mean, expected_mean)


def test_fedbn_keeps_each_clients_norm_layers(data):
    """bn=local: the clients' dense layers are the global model's, their batch-norm layers
    their own; a client not yet sampled keeps the initial ones."""
    model = make_model(NormNet(), (5,), 3)
    config = mcfl.RunConfig(lr=0.1, local_steps=2, batch_size=4, bn="local")
    plan = mcfl.resolve(config)
    algorithm = Bound(with_local_norm(get("fedavg").build(plan.context(model, 2)),
                                      model.collections),
                      plan.hyperparams(model))
    state = algorithm.init(data, jax.random.key(0))
    initial = algorithm.client_models(state)[0]
    step = jax.jit(lambda st, k: algorithm.round(st, data, k))
    state, metrics = step(state, jax.random.key(1))
    assert "client_local" not in metrics
    models, index = algorithm.client_models(state)
    assert np.array_equal(index, np.arange(4))
    dense = models["params"]["Dense_0"]["kernel"]
    assert all(np.array_equal(dense[0], dense[i]) for i in range(4))  # global
    norm = np.asarray(models["batch_stats"]["BatchNorm_0"]["mean"])
    first = np.asarray(initial["batch_stats"]["BatchNorm_0"]["mean"])
    changed = [not np.allclose(norm[i], first[i]) for i in range(4)]
    assert sum(changed) == 2  # the two clients of the round
    trained = [i for i in range(4) if changed[i]]
    assert not np.allclose(norm[trained[0]], norm[trained[1]])
    assert set(map(len, (local_part(jax.tree.map(lambda m: m[0], models),
                                    model.collections),))) == {4}  # mean, var, scale, bias
    with pytest.raises(ConfigError, match="has no mutable collections"):
        with_local_norm(get("fedavg").build(plan.context(make_model(NamedMLP(), (5,), 3),
                                                         2)), ())


def test_stateful_models_run_end_to_end_and_gradient_algorithms_refuse_them():
    config = mcfl.RunConfig(algorithm="fesem", clients=8, rounds=1, clients_per_round=4,
                            synthetic_beta=0.5, local_steps=2, bn="local")
    result = mcfl.run(config, model=NormNet(10))
    assert result.summary["config"]["model"] == "python:NormNet"
    assert np.isfinite(result.summary["final_accuracy_micro"])
    with pytest.raises(ConfigError, match="fedsgd steps the global model by the clients' "
                                          "gradients"):
        mcfl.run(config.replace(algorithm="fedsgd", local_steps=None), model=NormNet(10))
    with pytest.raises(ConfigError, match="was given as a Python object; pass it again"):
        mcfl.run(config.replace(model="python:NormNet"))


def _fast_and_generic(spec, data, lr, block_size, **fields):
    """Four clients' models after 3 local steps from one start, trained on the factored path
    (``low_rank="on"``) and on the generic one (``"off"``), and the start [1, ...]."""
    start = jax.tree.map(lambda p: p[None], spec.init(jax.random.key(0)))
    selection = RoundClients(jnp.arange(4, dtype=jnp.int32), jnp.zeros(4, jnp.int32))
    results = []
    for low_rank in ("on", "off"):
        training = LocalTraining(spec.apply, batch_size=4, lr=lr, local_steps=3,
                                 fast=FastPaths(low_rank=low_rank, **fields))
        results.append(jax.jit(lambda t=training: train_and_collect(
            Start(start, selection, training=t),
            data, jax.random.key(3), block_size=block_size))()[0])
    return results[0], results[1], start


def test_dense_stack_found_by_structure_equals_the_generic_path(data):
    spec = make_model(NamedMLP(), (5,), 3)
    assert spec.dense_layers == ("hidden", "logits")
    assert find_dense_stack(make_model(TanhMLP(), (5,), 3)) is None
    assert make_model(NamedMLP(), (5,), 3, fast_paths="off").dense_layers is None
    fast, generic, start = _fast_and_generic(spec, data, 0.2, 4,
                                             dense_layers=spec.dense_layers)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 fast, generic)
    assert not np.allclose(fast["hidden"]["kernel"], start["hidden"]["kernel"][0])


class ConvHead(nn.Module):
    """A conv trunk, then one large dense layer (most of the parameters) and a small head."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3))(x.reshape((x.shape[0], 6, 6, 1))))
        x = nn.relu(nn.Dense(64, name="big")(x.reshape((x.shape[0], -1))))
        return nn.Dense(3)(x)


def test_a_large_dense_layer_found_by_structure_trains_factored_as_the_generic_path(data):
    """The user's CNN is seen as head(trunk(x) @ K + b) around its layer "big"; local training
    with K's change kept as factors equals plain per-client training (values of every
    parameter after 3 steps)."""
    images = ragged_dataset([7, 12, 5, 9], num_features=36).arrays
    spec = make_model(ConvHead(), (36,), 3)
    assert spec.factored is not None and spec.factored.name == "big"
    assert make_model(ConvHead(), (36,), 3, fast_paths="off").factored is None
    assert make_model(NormNet(), (5,), 3).factored is None  # a train mode: generic path
    fast, generic, start = _fast_and_generic(spec, images, 0.1, 1, factored=spec.factored)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                 fast, generic)
    assert not np.allclose(fast["big"]["kernel"], start["big"]["kernel"][0])


def test_convolutions_as_matmul_equal_flax_conv_in_values_and_gradients():
    fast = make_model(ConvStack(), (36,), 3, conv="matmul")
    generic = make_model(ConvStack(), (36,), 3, fast_paths="off")
    assert fast.apply is not generic.apply
    params = generic.init(jax.random.key(0))
    jax.tree.map(np.testing.assert_array_equal, fast.init(jax.random.key(0)), params)
    x = jax.random.normal(jax.random.key(1), (4, 36))
    np.testing.assert_allclose(fast.apply(params, x), generic.apply(params, x), atol=1e-5)
    grads = [jax.grad(lambda p, m=m: jnp.sum(jnp.sin(m.apply(p, x))))(params)
             for m in (fast, generic)]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), *grads)
    # XLA's convolution traced as the matmul form: a dot, and no convolution, for the strides-1
    # and strides-2 'SAME' layers; the 'VALID' one stays a convolution
    text = jax.jit(fast.apply).lower(params, x).as_text()
    assert text.count("convolution") == 1
    assert jax.jit(generic.apply).lower(params, x).as_text().count("convolution") == 3


def test_local_training_of_a_config_carries_the_models_train_mode():
    model = make_model(NormNet(), (5,), 3)
    training = mcfl.resolve(mcfl.RunConfig()).local_training(model)
    assert training.train_apply is model.train_apply
    assert training.collections == ("batch_stats",)
    assert mcfl.resolve(mcfl.RunConfig()).local_training(
        make_model("mclr", (5,), 3)).train_apply is None


def test_docs_own_model_example_runs(capsys):
    """The docs' "Your own model" page's first block, as written: a flax CNN with dropout on
    numpy arrays, a FeSEM run and a sweep; FeSEM finds the two planted groups."""
    code = OWN_MODEL_PAGE.read_text().split("```python\n")[1]
    exec(compile(code.split("```")[0], str(OWN_MODEL_PAGE), "exec"), {})
    run_line, sweep_line = capsys.readouterr().out.strip().splitlines()
    accuracy, ari = map(float, run_line.split())
    assert 0.2 < accuracy <= 1 and ari == 1.0
    assert sweep_line.startswith("[(0.05, ") and "(0.1, " in sweep_line


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-n", "0", "-q"]))
