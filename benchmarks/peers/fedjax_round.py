"""One FedAvg round of the peer workload with fedjax 0.0.17 (run from the peers venv).

    /work/peers-venv/bin/python benchmarks/peers/fedjax_round.py --clients 1000 --rounds 3 \\
        --json fedjax.json
    /work/peers-venv/bin/python benchmarks/peers/fedjax_round.py --check

Uses ``fedjax.algorithms.fed_avg.federated_averaging`` as a user would: a haiku MLP wrapped by
``fedjax.create_model_from_haiku``, ``fedjax.model_grad``, client SGD lr 0.01, server SGD lr 1.0
(so the server step is exactly the mean of the client models), and fedjax's default
for_each_client backend (``ForEachClientJitBackend``: one jitted call per client step, clients
run one after another). Each client's data is a ``fedjax.ClientDataset`` batched by
``ShuffleRepeatBatchHParams(batch_size=10, num_epochs=1, skip_shuffle=True)``: its 50 rows in
order, 5 batches. The list of (client id, dataset, PRNG key) is built once, outside the timing;
a timed round is one ``algorithm.apply`` (batching, client training, weighted averaging, the
per-client update-norm diagnostics fedjax computes, server step), blocked until done.

fedjax 0.0.17 calls ``jax.tree_map``, which current jax removed; ``install_jax_shims`` puts the
missing aliases back before fedjax is imported.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import jax  # noqa: E402
import workload as wl  # noqa: E402

# fedjax 0.0.17 calls ``jax.tree_map`` (core/tree_util.py: tree_weight and tree_zeros_like,
# which FedAvg's averaging uses; core/regularizers.py), no longer in jax 0.10. Nothing else
# it or dm-haiku 0.0.17 reaches on this path needs a shim with jax 0.10.2.
JAX_SHIMS = {"tree_map": "map"}


def install_jax_shims() -> list[str]:
    """Point the removed ``jax.tree_*`` aliases that are missing at ``jax.tree``; list them."""
    installed = []
    for name, target in JAX_SHIMS.items():
        if not hasattr(jax, name):
            setattr(jax, name, getattr(jax.tree, target))
            installed.append(f"jax.{name} = jax.tree.{target}")
    return installed


SHIMS = install_jax_shims()

import fedjax  # noqa: E402
import haiku as hk  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from fedjax.algorithms import fed_avg  # noqa: E402

NAME = "fedjax 0.0.17 FedAvg"
SERVER_LR = 1.0


def mlp_forward(batch: dict) -> jnp.ndarray:
    """Haiku forward pass: logits of the 784-200-200-10 ReLU MLP."""
    h = batch["x"]
    for i, width in enumerate(wl.LAYER_SIZES[1:]):
        h = hk.Linear(width, name=f"dense{i}")(h)
        if i < wl.NUM_LAYERS - 1:
            h = jax.nn.relu(h)
    return h


def per_example_loss(batch: dict, logits: jnp.ndarray) -> jnp.ndarray:
    """Softmax cross-entropy of each example (fedjax averages it over the batch)."""
    return fedjax.metrics.unreduced_cross_entropy_loss(batch["y"], logits)


def make_model() -> fedjax.Model:
    """The MLP as a fedjax Model built from haiku."""
    sample = {"x": np.zeros((1, wl.NUM_FEATURES), np.float32), "y": np.zeros(1, np.int32)}
    return fedjax.create_model_from_haiku(hk.transform(mlp_forward), sample, per_example_loss)


HAIKU_LAYOUT = ("dense{}", "w", "b")


def to_haiku(params: dict[str, np.ndarray]) -> dict:
    """Workload layout -> haiku's {"dense{i}": {"w": [in, out], "b": [out]}}."""
    return jax.tree.map(jnp.asarray, wl.nest_layers(params, *HAIKU_LAYOUT))


def from_haiku(params: dict) -> dict[str, np.ndarray]:
    """Haiku params -> the workload layout, as NumPy arrays."""
    return wl.flatten_layers(params, *HAIKU_LAYOUT)


def make_clients(work: wl.Workload, seed: int) -> list[tuple]:
    """fedjax's (client id, ClientDataset, PRNG key) triples, one per client."""
    keys = jax.random.split(jax.random.PRNGKey(seed), work.num_clients)
    return [(f"{c:06d}".encode(), fedjax.ClientDataset({"x": work.x[c], "y": work.y[c]}), keys[c])
            for c in range(work.num_clients)]


class FedjaxRunner:
    """fedjax FedAvg over the workload's clients; see the module docstring."""

    def __init__(self, work: wl.Workload, seed: int = 0):
        """Build the model, the FedAvg algorithm, its server state and the client list."""
        model = make_model()
        initial = to_haiku(work.params)
        shapes = jax.tree.map(jnp.shape, model.init(jax.random.PRNGKey(0)))
        if shapes != jax.tree.map(jnp.shape, initial):
            raise ValueError(f"haiku parameter layout differs: {shapes}")
        batching = fedjax.ShuffleRepeatBatchHParams(
            batch_size=wl.BATCH_SIZE, num_epochs=1, skip_shuffle=True)
        self.algorithm = fed_avg.federated_averaging(
            grad_fn=fedjax.model_grad(model),
            client_optimizer=fedjax.optimizers.sgd(wl.LEARNING_RATE),
            server_optimizer=fedjax.optimizers.sgd(SERVER_LR),
            client_batch_hparams=batching)
        self.state = self.algorithm.init(initial)
        self.clients = make_clients(work, seed)

    def run_round(self) -> None:
        """One ``algorithm.apply`` over all clients, blocked until every result is ready."""
        self.state, diagnostics = self.algorithm.apply(self.state, self.clients)
        jax.block_until_ready((self.state.params, diagnostics))

    def global_params(self) -> dict[str, np.ndarray]:
        """The server model in the workload layout."""
        return from_haiku(self.state.params)


def describe(args) -> dict:
    """Name, versions and settings reported with the result."""
    return {
        "name": NAME,
        "jax_version": jax.__version__,
        "fedjax_version": metadata.version("fedjax"),
        "haiku_version": metadata.version("dm-haiku"),
        "devices": [str(d) for d in jax.devices()],
        "for_each_client_backend": type(fedjax.get_for_each_client_backend()).__name__,
        "shims": SHIMS,
    }


if __name__ == "__main__":
    sys.exit(harness.main(lambda work, args: FedjaxRunner(work, args.seed), describe))
