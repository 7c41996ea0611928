"""The fixed workload of the peer benchmarks: one FedAvg round of an MLP over C clients.

NumPy only, so that any virtual environment can import it by path.

Workload
    C clients, each with exactly ``ROWS_PER_CLIENT`` = 50 rows of 784 float32 features and an
    int32 label in [0, 10). Model: MLP 784-200-200-10, ReLU, dense layers with bias, logits out,
    loss = mean softmax cross-entropy over the batch. Each client starts from the global model
    and runs ``LOCAL_STEPS`` = 5 SGD steps (lr 0.01) on batches of ``BATCH_SIZE`` = 10 taken in
    row order without shuffling (rows 0-9, 10-19, ...). The server's new model is the plain
    mean of the client models (equal weights: every client has 50 rows).

Parameter layout (a flat dict of float32 NumPy arrays), for layer ``i`` in 0, 1, 2:
    ``kernel{i}``: [in, out] (784x200, 200x200, 200x10), so ``out = inputs @ kernel + bias``
    ``bias{i}``:   [out]
Kernels are Glorot-uniform from the seed, biases zero.

Data
    If Debian's ``dataset-fashion-mnist`` is installed, the Fashion-MNIST training images scaled
    to [0, 1] and their labels, assigned to clients in row order (client c holds rows
    50c .. 50c+49; past the 60,000 training rows the assignment wraps around). Otherwise
    standard-normal features with uniformly random labels. ``Workload.source`` says which.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROWS_PER_CLIENT = 50
BATCH_SIZE = 10
LOCAL_STEPS = ROWS_PER_CLIENT // BATCH_SIZE
LEARNING_RATE = 0.01
LAYER_SIZES = (784, 200, 200, 10)
NUM_FEATURES = LAYER_SIZES[0]
NUM_CLASSES = LAYER_SIZES[-1]
NUM_LAYERS = len(LAYER_SIZES) - 1

# Debian installs the files under /usr/share/datasets/fashion-mnist; the other path is the
# package's name, checked as well in case another packaging uses it.
FMNIST_DIRS = (Path("/usr/share/datasets/fashion-mnist"), Path("/usr/share/dataset-fashion-mnist"))
FMNIST_IMAGES = "train-images-idx3-ubyte.gz"
FMNIST_LABELS = "train-labels-idx1-ubyte.gz"


@dataclass
class Workload:
    """Inputs of one benchmark round: x [C, 50, 784] f32, y [C, 50] i32, params, data source."""

    x: np.ndarray
    y: np.ndarray
    params: dict[str, np.ndarray]
    source: str

    @property
    def num_clients(self) -> int:
        """Number of clients C."""
        return int(self.x.shape[0])


def param_names() -> list[str]:
    """The parameter keys in layer order: kernel0, bias0, kernel1, bias1, kernel2, bias2."""
    return [f"{kind}{i}" for i in range(NUM_LAYERS) for kind in ("kernel", "bias")]


def nest_layers(params: dict[str, np.ndarray], layer: str, kernel: str, bias: str) -> dict:
    """The workload's flat layout as a framework's nested one: ``{layer.format(i): {kernel:
    [in, out], bias: [out]}}`` (flax: "Dense_{}", "kernel", "bias"; haiku: "dense{}", "w", "b")."""
    return {layer.format(i): {kernel: params[f"kernel{i}"], bias: params[f"bias{i}"]}
            for i in range(NUM_LAYERS)}


def flatten_layers(nested: dict, layer: str, kernel: str, bias: str) -> dict[str, np.ndarray]:
    """`nest_layers` undone, as NumPy arrays."""
    out = {}
    for i in range(NUM_LAYERS):
        out[f"kernel{i}"] = np.asarray(nested[layer.format(i)][kernel])
        out[f"bias{i}"] = np.asarray(nested[layer.format(i)][bias])
    return out


def init_params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Glorot-uniform kernels [in, out] and zero biases [out], float32."""
    params = {}
    for i, (fan_in, fan_out) in enumerate(zip(LAYER_SIZES[:-1], LAYER_SIZES[1:])):
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        params[f"kernel{i}"] = rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)
        params[f"bias{i}"] = np.zeros(fan_out, np.float32)
    return params


def find_fmnist() -> Path | None:
    """The folder holding Fashion-MNIST's training IDX files, or None if not installed."""
    for folder in FMNIST_DIRS:
        if (folder / FMNIST_IMAGES).is_file() and (folder / FMNIST_LABELS).is_file():
            return folder
    return None


def read_idx(path: Path) -> np.ndarray:
    """Read a gzipped IDX file of unsigned bytes into an array of its stated shape."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[:2] != b"\0\0" or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def fmnist_rows(folder: Path, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``num_rows`` training rows (wrapping around), features in [0, 1]."""
    images = read_idx(folder / FMNIST_IMAGES).reshape(-1, NUM_FEATURES)
    labels = read_idx(folder / FMNIST_LABELS)
    index = np.arange(num_rows) % images.shape[0]
    return (images[index] / np.float32(255)).astype(np.float32), labels[index].astype(np.int32)


def random_rows(rng: np.random.Generator, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Standard-normal features and uniformly random labels."""
    x = rng.standard_normal((num_rows, NUM_FEATURES), dtype=np.float32)
    y = rng.integers(0, NUM_CLASSES, num_rows).astype(np.int32)
    return x, y


def make_workload(num_clients: int = 1000, seed: int = 0, data: str = "auto") -> Workload:
    """Build the benchmark's data and initial global model.

    ``data``: ``"auto"`` (Fashion-MNIST if installed, else random), ``"fmnist"`` (required) or
    ``"random"``. The parameters depend only on ``seed``; random data too.
    """
    num_rows = num_clients * ROWS_PER_CLIENT
    params_rng, data_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    params = init_params(params_rng)
    folder = find_fmnist() if data in ("auto", "fmnist") else None
    if data == "fmnist" and folder is None:
        raise FileNotFoundError(f"Fashion-MNIST not found in {[str(d) for d in FMNIST_DIRS]}")
    if data not in ("auto", "fmnist", "random"):
        raise ValueError(f"data must be auto, fmnist or random, not {data!r}")
    if folder is not None:
        x, y = fmnist_rows(folder, num_rows)
        source = f"fashion-mnist train rows 0..{num_rows - 1} (mod 60000) from {folder}"
    else:
        x, y = random_rows(data_rng, num_rows)
        source = f"random: standard-normal features, uniform labels (seed {seed})"
    x = x.reshape(num_clients, ROWS_PER_CLIENT, NUM_FEATURES)
    y = y.reshape(num_clients, ROWS_PER_CLIENT)
    return Workload(x=x, y=y, params=params, source=source)


def batch_slices() -> list[slice]:
    """The row slices of a client's local steps, in order: 0-9, 10-19, ..."""
    return [slice(s * BATCH_SIZE, (s + 1) * BATCH_SIZE) for s in range(LOCAL_STEPS)]


def forward(params: dict[str, np.ndarray], x: np.ndarray) -> list[np.ndarray]:
    """Activations of every layer: [inputs, hidden0, hidden1, logits] (hidden after ReLU)."""
    acts = [x]
    for i in range(NUM_LAYERS):
        z = acts[-1] @ params[f"kernel{i}"] + params[f"bias{i}"]
        acts.append(np.maximum(z, 0) if i < NUM_LAYERS - 1 else z)
    return acts


def softmax_xent_grad(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Gradient of the batch-mean softmax cross-entropy with respect to the logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=1, keepdims=True)
    probs[np.arange(labels.size), labels] -= 1
    return probs / labels.size


def gradients(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> dict:
    """Manual backprop of the mean cross-entropy through the MLP."""
    acts = forward(params, x)
    delta = softmax_xent_grad(acts[-1], y)
    grads = {}
    for i in reversed(range(NUM_LAYERS)):
        grads[f"kernel{i}"] = acts[i].T @ delta
        grads[f"bias{i}"] = delta.sum(axis=0)
        if i > 0:
            delta = (delta @ params[f"kernel{i}"].T) * (acts[i] > 0)
    return grads


def local_train(params: dict, x: np.ndarray, y: np.ndarray, lr: float) -> dict:
    """One client's local training: SGD over its batches in row order."""
    for rows in batch_slices():
        grads = gradients(params, x[rows], y[rows])
        params = {k: v - lr * grads[k] for k, v in params.items()}
    return params


def reference_round(x: np.ndarray, y: np.ndarray, params: dict[str, np.ndarray],
                    lr: float = LEARNING_RATE, dtype=np.float64) -> dict[str, np.ndarray]:
    """The oracle: one FedAvg round in plain NumPy, computed in ``dtype`` (float64 default).

    Loops over clients; each trains from ``params``; returns the mean client model in float32.
    """
    start = {k: v.astype(dtype) for k, v in params.items()}
    total = {k: np.zeros_like(v) for k, v in start.items()}
    for c in range(x.shape[0]):
        trained = local_train(start, x[c].astype(dtype), y[c], lr)
        for k in total:
            total[k] += trained[k]
    return {k: (v / x.shape[0]).astype(np.float32) for k, v in total.items()}


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """Largest absolute difference over all parameters of two models in this layout."""
    return max(float(np.max(np.abs(np.asarray(a[k], np.float64) - b[k]))) for k in param_names())
