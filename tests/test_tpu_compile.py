"""Every program compiled by the real TPU compiler on this CPU-only machine
(`mcfl.planning.tpu_compile`, the ``tpu-aot`` extra, which the test extra installs): every
registered algorithm's initialisation and round, FedAvg on every registered model, for one
chip of TPU v5e (Colab's v5e-1); the compiler's figures against hand-computed ones; and
`mcfl plan --target tpu-...` answering from them. Skipped, with the reason, without libtpu."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conformance_setup import build_small, fedavg_on, planted_data

from mcfl.algorithms import names
from mcfl.apps.libtpu_environment import PLACEHOLDER
from mcfl.models.registry import MODELS
from mcfl.planning import tpu_compile

pytestmark = pytest.mark.skipif(tpu_compile.missing() is not None,
                                reason=str(tpu_compile.missing()))

TARGET = "tpu-v5e-1"
# The registered models, small: (feature shape, classes, model args). The two paper CNNs keep
# their layers (conv-pool-conv-pool, then their fc1024 / fc2048) on 12 x 12 images: the same
# operations, compiled in 4.5 s instead of 9.2 s at 28 x 28 (FlexCFL's CNN alone, 2-core EPYC,
# 2026-12-08; 20 s each inside the suite).
MODEL_CASES = {
    "mclr": ((12,), 10, {}),
    "mlp": ((12,), 10, {"hidden": (8,)}),
    "cnn-fmnist": ((12, 12, 1), 10, {}),
    "cnn-leaf": ((12, 12, 1), 10, {}),
    "cnn-celeba": ((32, 32, 3), 2, {}),
    "cnn-cifar": ((8, 8, 3), 10, {}),
    "cnn-cifar-bn": ((8, 8, 3), 10, {}),
    "resnet18-gn": ((8, 8, 3), 10, {"width": 4, "groups": 2}),
    "char-lstm": ((6,), 80, {"units": 8, "embed": 4}),
    "transformer-char": ((6,), 80, {"width": 8, "heads": 2, "layers": 1}),
}


def compile_init_and_round(bound, data, target=TARGET):
    """The bound algorithm's initialisation and round compiled for `target`: their
    `CompiledProgram`s."""
    where = tpu_compile.placement(target)
    keys = jax.random.split(jax.random.key(0))
    init, state = tpu_compile.compile_program("init", jax.jit(bound.init), (data, keys[0]),
                                              where)
    round_, _ = tpu_compile.compile_program(
        "round", jax.jit(bound.round), (state, data, keys[1], jnp.asarray(1, jnp.int32)),
        where)
    return init, round_


@pytest.fixture(scope="module")
def data():
    return planted_data().arrays


@pytest.mark.parametrize("name", names())
def test_every_algorithm_compiles_for_tpu_v5e(name, data):
    init, round_ = compile_init_and_round(build_small(name, backend="tpu"), data)
    for program in (init, round_):
        assert program.argument_bytes > 0 and program.code_bytes > 0
        assert program.need_bytes < 2**30  # the small problem: far below a v5e's 15.75 GiB
    assert round_.flops > 0 and round_.fusions > 0


def test_every_registered_model_has_a_case():
    assert set(MODEL_CASES) == set(MODELS.names())


@pytest.mark.parametrize("model_name", sorted(MODEL_CASES))
def test_fedavg_on_every_model_compiles_for_tpu_v5e(model_name):
    shape, classes, args = MODEL_CASES[model_name]
    bound, data = fedavg_on(model_name, shape, classes, args, backend="tpu")
    init, round_ = compile_init_and_round(bound, data)
    assert round_.flops > 0 and round_.need_bytes > init.output_bytes


def test_the_compilers_hbm_and_devices():
    # (libtpu 0.0.42.1: the HBM a program's buffers may use, below each datasheet's)
    assert tpu_compile.hbm_available("tpu-v5e-1") == int(15.75 * 2**30)
    assert abs(tpu_compile.hbm_available("tpu-v2-8") - 7.48 * 2**30) < 2**20
    assert tpu_compile.hbm_available("tpu-v6e-1") == int(31.25 * 2**30)
    for target, topology in tpu_compile.TOPOLOGIES.items():
        found = tpu_compile.devices(target)
        assert {d.device_kind for d in found} == {topology.device_kind}
    assert len(tpu_compile.devices("tpu-v2-8")) == 8  # 4 chips of 2 cores
    assert len(tpu_compile.devices("tpu-v5e-8")) == 8


def test_memory_padding_and_loops_against_hand_computed_figures():
    where = tpu_compile.placement(TARGET)
    # f32[8, 100] pads its 100 lanes to 128: 8 x 128 x 4 bytes on the device
    program, _ = tpu_compile.compile_program(
        "pad", jax.jit(lambda a: a * 2.0), (jax.ShapeDtypeStruct((8, 100), jnp.float32),), where)
    assert program.argument_bytes == program.output_bytes == 8 * 128 * 4
    assert program.logical_bytes == 2 * 8 * 100 * 4
    assert program.padding_bytes == 2 * 8 * 28 * 4

    # a scan of 10 matmuls: the compiler counts its body once, per_device() all 10 (the
    # nine further passes from mcfl's count)
    def ten(a):
        return jax.lax.scan(lambda c, _: (c @ a, None), a, None, length=10)[0]

    program, _ = tpu_compile.compile_program(
        "scan", jax.jit(ten), (jax.ShapeDtypeStruct((256, 256), jnp.float32),), where)
    one = 2 * 256**3
    assert program.flops == pytest.approx(one, rel=0.01)
    assert program.per_device().flops == pytest.approx(10 * one, rel=0.01)
    assert program.per_device().matmul_flops == pytest.approx(10 * one, rel=0.01)


def test_a_program_too_large_is_refused_with_the_compilers_figures():
    where = tpu_compile.placement(TARGET)
    gib = 2**30
    big = jax.ShapeDtypeStruct((10 * gib // 4,), jnp.float32)  # 10 GiB in, 10 GiB out
    with pytest.raises(tpu_compile.OutOfMemory) as refused:
        tpu_compile.compile_program("big", jax.jit(lambda a: a + 1), (big,), where)
    refusal = refused.value.refusal
    assert refusal.required_bytes == 20 * gib
    assert refusal.available_bytes == int(15.75 * gib)


def test_refusal_messages_are_read():
    error = RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
                         "required for HLO temporaries (30.00G) exceeds available HBM (15.75G).")
    refusal = tpu_compile.refusal_of("round", error)
    assert refusal.required_bytes == 30 * 2**30
    assert refusal.available_bytes == int(15.75 * 2**30)
    assert tpu_compile.refusal_of("round", RuntimeError("INVALID_ARGUMENT: no")) is None


def plan(*args) -> dict:
    """`mcfl plan ARGS --json` in a process of its own, whose environment lacks the libtpu
    placeholder the session names (tests/conftest.py): the command line names it itself."""
    env = {k: v for k, v in os.environ.items() if k not in PLACEHOLDER}
    out = subprocess.run([sys.executable, "-m", "mcfl.apps.cli", "plan", "--no-cache", "--json",
                          *args], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    assert "TPU_ACCELERATOR_TYPE" not in out.stderr  # libtpu's start-up lines kept quiet
    return json.loads(out.stdout)


def test_mcfl_plan_compiles_for_colab_tpus():
    document = plan("--algorithm", "fedavg", "--dataset", "synthetic", "--clients", "300",
                    "--model", "mlp", "--rounds", "3", "--target", "tpu-v5e-1",
                    "--target", "tpu-v2-8")
    v5e, v2 = (document["targets"][t]["compiled"] for t in ("tpu-v5e-1", "tpu-v2-8"))
    assert v5e["device_kind"] == "TPU v5 lite" and v5e["devices"] == 1
    assert v2["device_kind"] == "TPU v2" and v2["devices"] == 8
    for target, compiled in (("tpu-v5e-1", v5e), ("tpu-v2-8", v2)):
        assert compiled["fits"] and document["targets"][target]["fits"]
        assert set(compiled["programs"]) == {"init", "round", "evaluate"}
        need = max(p["need_bytes"] for p in compiled["programs"].values())
        assert document["targets"][target]["need_bytes"] == need == compiled["need_bytes"]
        # the data are on every device: every program's arguments hold them
        assert all(p["argument_bytes"] >= document["data_bytes"]
                   for p in compiled["programs"].values())
    assert document["tpu_note"] is None


def test_mcfl_plan_reports_a_run_that_does_not_fit():
    # an MLP of 2 x 8,000 hidden units (65 M parameters, 260 MB a model) trained 100 clients
    # a round in one block: 26 GB of models on a 15.75 GiB chip
    document = plan("--algorithm", "fedavg", "--dataset", "synthetic", "--clients", "100",
                    "--clients-per-round", "100", "--block-size", "100", "--model", "mlp",
                    "--hidden", "8000,8000", "--rounds", "2", "--target", "tpu-v5e-1")
    target = document["targets"]["tpu-v5e-1"]
    assert target["fits"] is False and target["compiled"]["fits"] is False
    refused = target["compiled"]["refused"]
    if refused is not None:
        assert refused["required_bytes"] > refused["available_bytes"] == int(15.75 * 2**30)
    else:
        assert target["need_bytes"] > target["compiled"]["hbm_bytes"]


def test_without_the_extra_plan_says_so(monkeypatch):
    from mcfl.apps import plan_command

    monkeypatch.setattr(tpu_compile, "missing", lambda: "libtpu is not installed")
    targets, note = plan_command.compiled_targets(("t4", "tpu-v5e-1"))
    assert targets == () and "tpu-v5e-1" in note and "not installed" in note
    monkeypatch.undo()
    assert plan_command.compiled_targets(("t4", "tpu-v5e-1")) == (("tpu-v5e-1",), None)
    assert np.isfinite(tpu_compile.hbm_available(TARGET))
