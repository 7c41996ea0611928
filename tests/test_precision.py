"""`--precision bfloat16`: bfloat16 matmuls on float32 master weights (`mcfl.models.precision`),
for the papers' models and any flax module, with results close to float32's."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conformance_setup import ZOO
from conftest import algorithm as build
from conftest import planted_gaussian

import mcfl
from mcfl.apps.cli import main
from mcfl.engine import LocalTraining, masked_cross_entropy
from mcfl.errors import ConfigError
from mcfl.models import make_model
from mcfl.models.registry import MODELS
from mcfl.models.registry import names as model_names


@pytest.fixture(scope="module")
def planted():
    return planted_gaussian(100)


def _ops(text: str, op: str) -> list[str]:
    return [line for line in text.splitlines() if f"stablehlo.{op}" in line]


def test_round_computes_in_bfloat16_on_float32_master_weights(planted):
    """The same FedAvg round in both precisions: only bfloat16's program holds bf16 matmuls,
    its parameters stay float32, and they land near float32's, not on them."""
    data, key = planted.arrays, jax.random.key(1)
    params, texts = {}, {}
    for precision in ("float32", "bfloat16"):
        model = make_model("mlp", (12,), 10, hidden=(16,), precision=precision)
        algorithm = build("fedavg", model, LocalTraining(model.apply, batch_size=10, lr=0.05),
                          20, 4)
        state = algorithm.init(data, jax.random.key(0))
        start = state.params
        lowered = jax.jit(algorithm.round).lower(state, data, key)
        texts[precision] = lowered.as_text()
        params[precision] = lowered.compile()(state, data, key)[0].params
    assert "bf16" not in texts["float32"]
    dots = _ops(texts["bfloat16"], "dot_general")
    assert any("bf16>" in line for line in dots), dots  # forward and backward matmuls
    # (the dense stack's factored path is off: it would compute in float32)
    assert make_model("mlp", (12,), 10, hidden=(16,), precision="bfloat16").dense_layers is None
    for leaf in jax.tree.leaves(params["bfloat16"]):
        assert leaf.dtype == jnp.float32
    f32, bf16, start = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)])
                        for t in (params["float32"], params["bfloat16"], start))
    update = np.linalg.norm(f32 - start)
    assert update > 0.1
    gap = np.linalg.norm(bf16 - f32) / update  # the update's relative error
    assert 0 < gap < 2e-2, gap


# every registered model at a tiny size: the zoo's conformance shapes and the papers' models
TINY_MODELS = {**ZOO, "mclr": ((12,), 10, {}), "mlp": ((12,), 10, {}),
               "cnn-fmnist": ((28, 28, 1), 10, {}), "cnn-leaf": ((28, 28, 1), 62, {}),
               "cnn-celeba": ((8, 8, 3), 2, {})}


@pytest.mark.slow  # (every registered model compiled; the default run checks a round, convolutions)
def test_every_registered_model_computes_every_matmul_in_bfloat16():
    """No float32 constant or carry promotes a layer back to float32 (the LSTM's forget bias
    once did, leaving its recurrent matmuls float32): every dot and convolution of each
    model's bfloat16 forward takes bfloat16 operands."""
    # a new model of mcfl's gets a tiny size here (models other tests register are not mcfl's)
    ours = {name for name in model_names() if MODELS.get(name).__module__.startswith("mcfl.")}
    assert set(TINY_MODELS) == ours
    for name, (shape, classes, args) in TINY_MODELS.items():
        model = make_model(name, shape, classes, model_args=args, precision="bfloat16")
        x = jnp.zeros((2, *shape))
        text = jax.jit(model.apply).lower(model.init(jax.random.key(0)), x).as_text()
        products = _ops(text, "dot_general") + _ops(text, "convolution")
        assert products, name
        float32 = [line for line in products if "bf16" not in line.split("->")[0]]
        assert not float32, (name, float32)


class _TinyCNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(2, (3, 3), padding="SAME")(x.reshape((-1, 4, 4, 1))))
        return nn.Dense(3)(x.reshape((x.shape[0], -1)))


@pytest.mark.parametrize("conv, op", [("xla", "convolution"), ("matmul", "dot_general")])
def test_a_users_convolutions_compute_in_bfloat16(conv, op):
    """flax's Conv, and the convolution-as-matmul path that intercepts it, see bfloat16
    inputs; the gradients with respect to the float32 parameters are float32."""
    model = make_model(_TinyCNN(), (16,), 3, conv=conv, fast_paths="auto" if conv == "matmul"
                       else "off", precision="bfloat16")
    params = model.init(jax.random.key(0))
    x, y = jax.random.normal(jax.random.key(1), (5, 16)), jnp.arange(5) % 3

    def loss(p):
        return masked_cross_entropy(model.apply(p, x), y, jnp.ones(5, bool))

    text = jax.jit(jax.grad(loss)).lower(params).as_text()
    assert any("bf16>" in line for line in _ops(text, op)), _ops(text, op)
    grads = jax.eval_shape(jax.grad(loss), params)
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))


class _Tokens(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Embed(1000, 4)(x.astype(jnp.int32))
        return nn.Dense(2)(h.reshape((h.shape[0], -1)))


class _Normed(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.Dense(2)(nn.BatchNorm(use_running_average=not train)(nn.Dense(4)(x)))


def test_token_ids_and_batch_statistics_stay_exact():
    """Inputs are not cast: character indices above 256 (999, 257: bfloat16 rounds them to
    1000 and 256) still pick their own embedding rows. BatchNorm's running statistics stay
    float32 and move by float32's amount (in bfloat16 a 0.99-momentum average barely moves)."""
    x = jnp.asarray([[999.0, 257.0], [3.0, 300.0]])
    f32, bf16 = (make_model(_Tokens(), (2,), 2, fast_paths="off", precision=p)
                 for p in ("float32", "bfloat16"))
    params = f32.init(jax.random.key(0))
    np.testing.assert_allclose(bf16.apply(params, x), f32.apply(params, x), rtol=2e-2,
                               atol=2e-3)
    f32, bf16 = (make_model(_Normed(), (3,), 2, fast_paths="off", precision=p)
                 for p in ("float32", "bfloat16"))
    model = f32.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (8, 3)) + 5.0
    stats = {}
    for name, spec in (("float32", f32), ("bfloat16", bf16)):
        logits, updated = spec.train_apply(model, x, jax.random.key(2))
        assert logits.dtype == jnp.float32
        stats[name] = updated["batch_stats"]
        assert all(s.dtype == jnp.float32 for s in jax.tree.leaves(stats[name]))
    moved = jax.tree.map(lambda new, old: new - old, stats["float32"], model["batch_stats"])
    moved_bf16 = jax.tree.map(lambda new, old: new - old, stats["bfloat16"],
                              model["batch_stats"])
    for a, b in zip(jax.tree.leaves(moved), jax.tree.leaves(moved_bf16)):
        np.testing.assert_allclose(b, a, rtol=5e-2, atol=1e-4)


def test_planted_clusters_within_one_point_of_float32(planted):
    """IFCA on 4 planted clusters (a seed whose random start recovers them: BENCHMARKS.md has
    FeSEM and IFCA on Fashion-MNIST over 3 seeds)."""
    results = {}
    for precision in ("float32", "bfloat16"):
        config = mcfl.RunConfig(algorithm="ifca", clients=100, rounds=8, clusters=4,
                                clients_per_round=1.0, eval_every=8, lr=0.05, seed=3,
                                embed_clients=0, precision=precision)
        results[precision] = mcfl.run(config, dataset=planted).summary
    for summary in results.values():
        assert summary["cluster_ari"] == 1.0
    accuracy = {p: s["final_accuracy_micro"] for p, s in results.items()}
    assert abs(accuracy["bfloat16"] - accuracy["float32"]) <= 0.01, accuracy


def test_bad_precision_is_one_line_exit_2(capsys):
    assert main(["run", "--precision", "float16"]) == 2
    err = capsys.readouterr().err
    assert "unknown precision 'float16'; allowed: float32, bfloat16" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(ConfigError, match="--low-rank on needs --precision float32"):
        mcfl.resolve(mcfl.RunConfig(precision="bfloat16", low_rank="on"))
