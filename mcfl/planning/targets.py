"""The machines `mcfl plan` sizes a run for: peak arithmetic, memory bandwidth and memory of
one device, each figure from its maker's published data (dense figures, no sparsity).

Which peak a program's matrix products get depends on the dtype and on JAX's default matmul
precision: float32 products run on TF32 tensor cores on Ampere and later GPUs, and as one
bfloat16 pass on TPUs (JAX's "default precision" docs), so `matmul_f32` is that rate where it
applies. Work outside products (elementwise, reductions) runs at `vector`, the plain float32
rate; a TPU's vector unit has no published figure, so its matrix peak stands in, which keeps
the time a lower bound. `cpu-here` is measured on this machine when asked for.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

TERA = 1e12
GB = 1e9
GIB = 2**30


class Target(NamedTuple):
    name: str
    description: str
    devices: int  # devices JAX sees on it
    matmul_f32: float  # FLOP/s of one device's float32 products (see the module docstring)
    matmul_bf16: float  # ... of its bfloat16 products
    vector: float  # ... of its other float32 work
    bandwidth: float  # bytes/s of one device's memory
    memory: float  # bytes of one device's memory
    source: str


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("t4", "NVIDIA T4 (Colab's free GPU)", 1, 8.1 * TERA, 8.1 * TERA, 8.1 * TERA,
           320 * GB, 16 * GB,
           "NVIDIA T4 datasheet: 8.1 TFLOPS FP32, 320 GB/s, 16 GB GDDR6; Turing has no "
           "bfloat16 tensor cores, so bfloat16 runs at the FP32 rate"),
    Target("l4", "NVIDIA L4 (Colab)", 1, 60 * TERA, 121 * TERA, 30.3 * TERA, 300 * GB, 24 * GB,
           "NVIDIA L4 datasheet: 30.3 TFLOPS FP32, 60 TF32 / 121 BF16 tensor (dense), "
           "300 GB/s, 24 GB"),
    Target("a100-40", "NVIDIA A100 40 GB SXM (Colab)", 1, 156 * TERA, 312 * TERA, 19.5 * TERA,
           1555 * GB, 40 * GB,
           "NVIDIA A100 datasheet: 19.5 TFLOPS FP32, 156 TF32 / 312 BF16 tensor (dense), "
           "1,555 GB/s, 40 GB HBM2"),
    Target("h100-80", "NVIDIA H100 80 GB SXM", 1, 494 * TERA, 989 * TERA, 67 * TERA,
           3350 * GB, 80 * GB,
           "NVIDIA H100 datasheet (SXM5): 67 TFLOPS FP32, 494 TF32 / 989 BF16 tensor "
           "(dense), 3.35 TB/s, 80 GB HBM3"),
    Target("h200", "NVIDIA H200 141 GB SXM", 1, 494 * TERA, 989 * TERA, 67 * TERA,
           4800 * GB, 141 * GB,
           "NVIDIA H200 datasheet (SXM): 67 TFLOPS FP32, 494 TF32 / 989 BF16 tensor (dense), "
           "4.8 TB/s, 141 GB HBM3e"),
    Target("tpu-v2-8", "Cloud TPU v2-8 (Colab's TPU): 4 chips, 8 cores", 8, 22.5 * TERA,
           22.5 * TERA, 22.5 * TERA, 300 * GB, 8 * GIB,
           "Cloud TPU docs, TPU v2: 45 TFLOPS bf16, 16 GiB HBM, 600 GB/s per chip; JAX sees "
           "each chip's 2 cores as devices, so half of each per device"),
    Target("tpu-v5e-1", "Cloud TPU v5e, 1 chip", 1, 197 * TERA, 197 * TERA, 197 * TERA,
           819 * GB, 16 * GIB,
           "Cloud TPU docs, TPU v5e: 197 TFLOPS bf16, 16 GiB HBM2, 819 GB/s per chip"),
    Target("tpu-v5e-8", "Cloud TPU v5e-8: 8 chips", 8, 197 * TERA, 197 * TERA, 197 * TERA,
           819 * GB, 16 * GIB,
           "Cloud TPU docs, TPU v5e: 197 TFLOPS bf16, 16 GiB HBM2, 819 GB/s per chip"),
    Target("tpu-v6e-1", "Cloud TPU v6e (Trillium), 1 chip", 1, 918 * TERA, 918 * TERA,
           918 * TERA, 1638 * GB, 32 * GB,
           "Cloud TPU docs, TPU v6e: 918 TFLOPS bf16, 32 GB HBM, 1,638 GB/s per chip"),
)}
CPU_HERE = "cpu-here"
NAMES = (CPU_HERE, *TARGETS)
DEFAULT = (CPU_HERE, "t4", "a100-40", "tpu-v2-8")


# What `jax.Device.device_kind` says on each target (the first that matches is taken).
DEVICE_KINDS = (("H200", "h200"), ("H100", "h100-80"), ("A100", "a100-40"), ("L4", "l4"),
                ("T4", "t4"), ("TPU v2", "tpu-v2-8"), ("TPU v5 lite", "tpu-v5e-1"),
                ("TPU v6 lite", "tpu-v6e-1"))


def for_device(device) -> str:
    """The target name of a JAX device ("cpu-here" for a CPU; "" for one not listed)."""
    if device.platform == "cpu":
        return CPU_HERE
    kind = str(device.device_kind)
    return next((name for key, name in DEVICE_KINDS if key in kind), "")


def measure_cpu(memory_bytes: float) -> Target:
    """This machine's CPU as a target: the best float32 matmul rate of a few 1024-square
    products (all cores, as XLA:CPU uses them) and the bytes/s of a 256 MB copy (read and
    written), each the best of 5."""
    a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
    matmul = 2 * 1024**3 / _best_seconds(lambda: a @ a)
    src = np.ones(64 * 2**20, np.float32)
    dst = np.empty_like(src)
    bandwidth = 2 * src.nbytes / _best_seconds(lambda: np.copyto(dst, src))
    return Target(CPU_HERE, "this machine's CPU (measured now)", 1, matmul, matmul, matmul,
                  bandwidth, memory_bytes,
                  "measured by mcfl plan: a 1024x1024 float32 matmul and a 256 MB copy, "
                  "best of 5")


def _best_seconds(fn, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)
