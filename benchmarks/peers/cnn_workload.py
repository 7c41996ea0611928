"""The CNN workload of the peer benchmarks: one FedAvg round of FlexCFL's FashionMNIST CNN.

NumPy only, so that any virtual environment can import it by path. The same interface as
``workload.py`` (``make_workload``, ``reference_round``, ``max_abs_diff``, ``LEARNING_RATE``),
so ``harness.py`` runs either.

Workload
    C clients (default 20), each with ``ROWS_PER_CLIENT`` = 120 rows of 28 x 28 = 784 float32
    features and an int32 label in [0, 10). Model (FlexCFL Table II, 3,274,634 parameters):
    5x5 'same' conv 1 -> 32, ReLU, 2x2 max-pool; 5x5 'same' conv 32 -> 64, ReLU, 2x2 max-pool;
    flatten; dense 3136 -> 1024, ReLU; dense 1024 -> 10 logits; loss = mean softmax
    cross-entropy over the batch. Each client starts from the global model and runs
    ``LOCAL_STEPS`` = 12 SGD steps (lr 0.01) on batches of ``BATCH_SIZE`` = 10 in row order
    without shuffling. The server's new model is the plain mean of the client models.

Parameter layout (a flat dict of float32 NumPy arrays), images as [B, H, W, C]:
    ``conv0`` [5, 5, 1, 32], ``conv1`` [5, 5, 32, 64] (kernel height, width, in, out: flax's
    layout), ``dense0`` [3136, 1024] whose rows follow the (h, w, c) flattening of the
    [7, 7, 64] feature map, ``dense1`` [1024, 10], and ``*_bias`` [out]. Kernels are
    Glorot-uniform from the seed, biases zero.

Data: the Fashion-MNIST training images scaled to [0, 1] when Debian's package is installed
(client c holds rows 120c .. 120c + 119), else standard-normal features with random labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import workload as mlp_workload

ROWS_PER_CLIENT = 120
BATCH_SIZE = 10
LOCAL_STEPS = ROWS_PER_CLIENT // BATCH_SIZE
LEARNING_RATE = 0.01
IMAGE = 28
NUM_FEATURES = IMAGE * IMAGE
NUM_CLASSES = 10
KERNEL = 5
CHANNELS = (1, 32, 64)
HIDDEN = 1024
FLAT = (IMAGE // 4) ** 2 * CHANNELS[-1]  # 7 * 7 * 64 = 3136
DEFAULT_CLIENTS = 20
SHAPES = {
    "conv0": (KERNEL, KERNEL, CHANNELS[0], CHANNELS[1]), "conv0_bias": (CHANNELS[1],),
    "conv1": (KERNEL, KERNEL, CHANNELS[1], CHANNELS[2]), "conv1_bias": (CHANNELS[2],),
    "dense0": (FLAT, HIDDEN), "dense0_bias": (HIDDEN,),
    "dense1": (HIDDEN, NUM_CLASSES), "dense1_bias": (NUM_CLASSES,),
}


@dataclass
class Workload:
    """Inputs of one benchmark round: x [C, 120, 784] f32, y [C, 120] i32, params, source."""

    x: np.ndarray
    y: np.ndarray
    params: dict[str, np.ndarray]
    source: str

    @property
    def num_clients(self) -> int:
        return int(self.x.shape[0])


def param_names() -> list[str]:
    return list(SHAPES)


def init_params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Glorot-uniform kernels (fans counting the kernel window) and zero biases, float32."""
    params = {}
    for name, shape in SHAPES.items():
        if name.endswith("_bias"):
            params[name] = np.zeros(shape, np.float32)
            continue
        window = int(np.prod(shape[:-2]))
        limit = np.sqrt(6.0 / (window * shape[-2] + window * shape[-1]))
        params[name] = rng.uniform(-limit, limit, shape).astype(np.float32)
    return params


def make_workload(num_clients: int = DEFAULT_CLIENTS, seed: int = 0,
                  data: str = "auto") -> Workload:
    """The round's data and initial global model (see `workload.make_workload` for `data`)."""
    if data not in ("auto", "fmnist", "random"):
        raise ValueError(f"data must be auto, fmnist or random, not {data!r}")
    num_rows = num_clients * ROWS_PER_CLIENT
    params_rng, data_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    params = init_params(params_rng)
    folder = mlp_workload.find_fmnist() if data in ("auto", "fmnist") else None
    if data == "fmnist" and folder is None:
        raise FileNotFoundError("Fashion-MNIST not found")
    if folder is not None:
        x, y = mlp_workload.fmnist_rows(folder, num_rows)
        source = f"fashion-mnist train rows 0..{num_rows - 1} (mod 60000) from {folder}"
    else:
        x, y = mlp_workload.random_rows(data_rng, num_rows)
        source = f"random: standard-normal features, uniform labels (seed {seed})"
    return Workload(x.reshape(num_clients, ROWS_PER_CLIENT, NUM_FEATURES),
                    y.reshape(num_clients, ROWS_PER_CLIENT), params, source)


# ----------------------------------------------------------------------------------------------
# The oracle: forward and backward by hand.


def im2col(x: np.ndarray) -> np.ndarray:
    """[B, H, W, C] -> [B, H, W, 25 C]: the 5x5 'same' windows, in (kh, kw, C) order."""
    _, h, w, _ = x.shape
    pad = KERNEL // 2
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    return np.concatenate([padded[:, i:i + h, j:j + w] for i in range(KERNEL)
                           for j in range(KERNEL)], axis=-1)


def col2im(d: np.ndarray, channels: int) -> np.ndarray:
    """The adjoint of `im2col`: [B, H, W, 25 C] -> [B, H, W, C]."""
    b, h, w, _ = d.shape
    pad = KERNEL // 2
    out = np.zeros((b, h + 2 * pad, w + 2 * pad, channels), d.dtype)
    for index, (i, j) in enumerate((i, j) for i in range(KERNEL) for j in range(KERNEL)):
        out[:, i:i + h, j:j + w] += d[..., index * channels:(index + 1) * channels]
    return out[:, pad:pad + h, pad:pad + w]


def pool(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2x2 max-pool of [B, H, W, C]; also the share of the gradient each input gets (ties
    split evenly, as jnp.max's gradient does; after a ReLU, ties are zeros with no gradient)."""
    b, h, w, c = x.shape
    windows = x.reshape(b, h // 2, 2, w // 2, 2, c)
    top = windows.max(axis=(2, 4))
    hit = windows == top[:, :, None, :, None]
    share = hit / hit.sum(axis=(2, 4), keepdims=True)
    return top, share


def unpool(d: np.ndarray, share: np.ndarray) -> np.ndarray:
    b, h2, _, w2, _, c = share.shape
    return (share * d[:, :, None, :, None]).reshape(b, 2 * h2, 2 * w2, c)


def gradients(params: dict, x: np.ndarray, y: np.ndarray) -> dict:
    """Gradient of the batch-mean cross-entropy with respect to every parameter."""
    b = x.shape[0]
    a0 = x.reshape(b, IMAGE, IMAGE, 1)
    p0 = im2col(a0)
    z0 = p0 @ params["conv0"].reshape(-1, CHANNELS[1]) + params["conv0_bias"]
    a1, s1 = pool(np.maximum(z0, 0))
    p1 = im2col(a1)
    z1 = p1 @ params["conv1"].reshape(-1, CHANNELS[2]) + params["conv1_bias"]
    a2, s2 = pool(np.maximum(z1, 0))
    h = a2.reshape(b, FLAT)
    z2 = h @ params["dense0"] + params["dense0_bias"]
    a3 = np.maximum(z2, 0)
    logits = a3 @ params["dense1"] + params["dense1_bias"]
    delta = mlp_workload.softmax_xent_grad(logits, y)
    g = {"dense1": a3.T @ delta, "dense1_bias": delta.sum(0)}
    d = (delta @ params["dense1"].T) * (z2 > 0)
    g.update(dense0=h.T @ d, dense0_bias=d.sum(0))
    d = (d @ params["dense0"].T).reshape(a2.shape)
    d = unpool(d, s2) * (z1 > 0)
    flat = d.reshape(-1, CHANNELS[2])
    g.update(conv1=(p1.reshape(-1, p1.shape[-1]).T @ flat).reshape(SHAPES["conv1"]),
             conv1_bias=flat.sum(0))
    d = col2im((flat @ params["conv1"].reshape(-1, CHANNELS[2]).T).reshape(p1.shape),
               CHANNELS[1])
    d = unpool(d, s1) * (z0 > 0)
    flat = d.reshape(-1, CHANNELS[1])
    g.update(conv0=(p0.reshape(-1, p0.shape[-1]).T @ flat).reshape(SHAPES["conv0"]),
             conv0_bias=flat.sum(0))
    return g


def local_train(params: dict, x: np.ndarray, y: np.ndarray, lr: float) -> dict:
    """One client's local training: SGD over its batches in row order."""
    for s in range(LOCAL_STEPS):
        rows = slice(s * BATCH_SIZE, (s + 1) * BATCH_SIZE)
        grads = gradients(params, x[rows], y[rows])
        params = {k: v - lr * grads[k] for k, v in params.items()}
    return params


def reference_round(x: np.ndarray, y: np.ndarray, params: dict[str, np.ndarray],
                    lr: float = LEARNING_RATE, dtype=np.float64) -> dict[str, np.ndarray]:
    """The oracle: one FedAvg round in plain NumPy (float64 by default), clients one by one;
    returns the mean client model in float32."""
    start = {k: v.astype(dtype) for k, v in params.items()}
    total = {k: np.zeros_like(v) for k, v in start.items()}
    for c in range(x.shape[0]):
        trained = local_train(start, x[c].astype(dtype), y[c], lr)
        for k in total:
            total[k] += trained[k]
    return {k: (v / x.shape[0]).astype(np.float32) for k, v in total.items()}


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return max(float(np.max(np.abs(np.asarray(a[k], np.float64) - b[k]))) for k in param_names())
