"""One FedAvg round of the peer workload as a plain PyTorch per-client loop (peers venv).

    /work/peers-venv/bin/python benchmarks/peers/torch_round.py --clients 1000 --rounds 3 \\
        --json torch.json
    /work/peers-venv/bin/python benchmarks/peers/torch_round.py --check

The pattern of PyTorch FL simulators such as PFLlib and FL-bench, written here from scratch:
for each client in turn, put the global model's weights into a client model (``--copy load``,
the default: ``load_state_dict`` into one reused client model, close to FL-bench;
``--copy deepcopy``: a ``copy.deepcopy`` of the global model, close to PFLlib's copying), make a
``torch.optim.SGD(lr=0.01)``, run 5 steps on its batches of 10 rows in order (tensor slices, no
DataLoader), keep a cloned ``state_dict``; then set the global model to the key-wise mean of
the kept state dicts. CPU, float32, ``torch.set_num_threads`` left at torch's default unless
``--threads N`` (reported as ``torch_num_threads``). The client tensors are made once, outside
the timing.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import workload as wl  # noqa: E402
from torch import nn  # noqa: E402

NAME = "PyTorch per-client loop"
COPY_MODES = ("load", "deepcopy")


def make_mlp() -> nn.Module:
    """The 784-200-200-10 ReLU MLP; layers at indices 0, 2, 4 of the Sequential."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(wl.LAYER_SIZES[:-1], wl.LAYER_SIZES[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < wl.NUM_LAYERS - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def to_state_dict(params: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Workload layout -> the Sequential's state dict (torch keeps weights as [out, in])."""
    state = {}
    for i in range(wl.NUM_LAYERS):
        state[f"{2 * i}.weight"] = torch.from_numpy(params[f"kernel{i}"].T.copy())
        state[f"{2 * i}.bias"] = torch.from_numpy(params[f"bias{i}"].copy())
    return state


def from_state_dict(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The Sequential's state dict -> workload layout, as NumPy arrays."""
    out = {}
    for i in range(wl.NUM_LAYERS):
        out[f"kernel{i}"] = state[f"{2 * i}.weight"].detach().numpy().T.copy()
        out[f"bias{i}"] = state[f"{2 * i}.bias"].detach().numpy().copy()
    return out


def train_client(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """5 SGD steps of batch 10 in row order; a cloned state dict of the result."""
    optimizer = torch.optim.SGD(model.parameters(), lr=wl.LEARNING_RATE)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for rows in wl.batch_slices():
        optimizer.zero_grad()
        loss = loss_fn(model(x[rows]), y[rows])
        loss.backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def average_states(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Equal-weight key-wise mean of the clients' state dicts."""
    return {k: torch.stack([s[k] for s in states]).mean(dim=0) for k in states[0]}


class TorchRunner:
    """PyTorch FedAvg over the workload's clients; see the module docstring."""

    def __init__(self, work: wl.Workload, copy_mode: str = "load"):
        """Global and client models from the workload's parameters; client data as tensors."""
        if copy_mode not in COPY_MODES:
            raise ValueError(f"copy_mode must be one of {COPY_MODES}")
        self.copy_mode = copy_mode
        self.global_model = make_mlp()
        self.global_model.load_state_dict(to_state_dict(work.params))
        self.client_model = make_mlp()
        self.x = torch.from_numpy(work.x)
        self.y = torch.from_numpy(work.y.astype(np.int64))

    def client_start(self) -> nn.Module:
        """A client model holding the global weights, by the chosen copy mode."""
        if self.copy_mode == "deepcopy":
            return copy.deepcopy(self.global_model)
        self.client_model.load_state_dict(self.global_model.state_dict())
        return self.client_model

    def run_round(self) -> None:
        """All clients train one after another, then the global model becomes their mean."""
        states = [train_client(self.client_start(), self.x[c], self.y[c])
                  for c in range(self.x.shape[0])]
        self.global_model.load_state_dict(average_states(states))

    def global_params(self) -> dict[str, np.ndarray]:
        """The global model in the workload layout."""
        return from_state_dict(self.global_model.state_dict())


def add_arguments(parser) -> None:
    """The script's own options: how a client gets the global weights; torch's thread count."""
    parser.add_argument("--copy", choices=COPY_MODES, default="load",
                        help="load_state_dict into one client model, or deepcopy the global one")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads(N) if N > 0; default: torch's own default")


def describe(args) -> dict:
    """Name, versions and settings reported with the result (applies ``--threads``)."""
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    return {
        "name": f"{NAME} ({args.copy})",
        "torch_version": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "copy_mode": args.copy,
    }


if __name__ == "__main__":
    sys.exit(harness.main(lambda work, args: TorchRunner(work, args.copy), describe,
                          add_arguments))
