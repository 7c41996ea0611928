"""One FedAvg round of the CNN workload (`cnn_workload.py`) as a plain PyTorch per-client loop.

    /work/peers-venv/bin/python benchmarks/peers/torch_cnn_round.py --clients 20 --rounds 4
    /work/peers-venv/bin/python benchmarks/peers/torch_cnn_round.py --check --check-clients 4

The same loop as ``torch_round.py`` (one reused client model, ``load_state_dict`` of the global
weights, a fresh ``torch.optim.SGD(lr=0.01)``, 12 steps on tensor slices of 10 rows, a cloned
``state_dict`` kept per client, then the key-wise mean), on FlexCFL's FashionMNIST CNN in
PyTorch's usual layout: ``nn.Conv2d(padding=2)`` on NCHW images, ``F.max_pool2d``, and the
feature map flattened in (C, H, W) order, so the workload's ``dense0`` rows (h, w, c) are
permuted on the way in and out. float32, torch's default thread count unless ``--threads N``;
on the CPU unless ``--device cuda`` (model and data on the GPU, each round ended by a
``torch.cuda.synchronize()``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cnn_workload as cw  # noqa: E402
import harness  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch_fedavg import average_into, train_client  # noqa: E402

NAME = "PyTorch per-client loop"
SIDE = cw.IMAGE // 4  # 7: the feature map's side before flattening


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        c0, c1, c2 = cw.CHANNELS
        self.conv0 = nn.Conv2d(c0, c1, cw.KERNEL, padding=cw.KERNEL // 2)
        self.conv1 = nn.Conv2d(c1, c2, cw.KERNEL, padding=cw.KERNEL // 2)
        self.dense0 = nn.Linear(cw.FLAT, cw.HIDDEN)
        self.dense1 = nn.Linear(cw.HIDDEN, cw.NUM_CLASSES)

    def forward(self, x):
        x = x.view(-1, 1, cw.IMAGE, cw.IMAGE)
        x = F.max_pool2d(F.relu(self.conv0(x)), 2)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return self.dense1(F.relu(self.dense0(x.flatten(1))))


def _dense0_to_torch(kernel: np.ndarray) -> np.ndarray:
    """[3136 rows in (h, w, c) order, 1024] -> torch's [1024, 3136 in (c, h, w) order]."""
    k = kernel.reshape(SIDE, SIDE, cw.CHANNELS[-1], cw.HIDDEN).transpose(2, 0, 1, 3)
    return k.reshape(cw.FLAT, cw.HIDDEN).T


def _dense0_from_torch(weight: np.ndarray) -> np.ndarray:
    k = weight.T.reshape(cw.CHANNELS[-1], SIDE, SIDE, cw.HIDDEN).transpose(1, 2, 0, 3)
    return k.reshape(cw.FLAT, cw.HIDDEN)


def to_state_dict(params: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Workload layout -> the CNN's state dict (OIHW conv weights, [out, in] dense weights)."""
    arrays = {}
    for name in ("conv0", "conv1"):
        arrays[f"{name}.weight"] = params[name].transpose(3, 2, 0, 1)  # HWIO -> OIHW
    arrays["dense0.weight"] = _dense0_to_torch(params["dense0"])
    arrays["dense1.weight"] = params["dense1"].T
    for name in ("conv0", "conv1", "dense0", "dense1"):
        arrays[f"{name}.bias"] = params[f"{name}_bias"]
    return {k: torch.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in arrays.items()}


def from_state_dict(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The CNN's state dict -> workload layout, as NumPy arrays."""
    n = {k: v.detach().numpy() for k, v in state.items()}
    out = {name: n[f"{name}.weight"].transpose(2, 3, 1, 0).copy() for name in ("conv0", "conv1")}
    out["dense0"] = _dense0_from_torch(n["dense0.weight"])
    out["dense1"] = n["dense1.weight"].T.copy()
    for name in ("conv0", "conv1", "dense0", "dense1"):
        out[f"{name}_bias"] = n[f"{name}.bias"].copy()
    return out


class TorchCNNRunner:
    def __init__(self, work: cw.Workload, device: str = "cpu"):
        self.device = torch.device(device)
        self.global_model = CNN().to(self.device)
        self.global_model.load_state_dict(to_state_dict(work.params))
        self.client_model = CNN().to(self.device)
        self.x = torch.from_numpy(work.x).to(self.device)
        self.y = torch.from_numpy(work.y.astype(np.int64)).to(self.device)

    def train_client(self, c: int) -> dict[str, torch.Tensor]:
        model = self.client_model
        return train_client(self.global_model, model, model.parameters(), self.x[c], self.y[c],
                            cw.LOCAL_STEPS, cw.BATCH_SIZE, cw.LEARNING_RATE)

    def run_round(self) -> None:
        average_into(self.global_model, [self.train_client(c) for c in range(self.x.shape[0])])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def global_params(self) -> dict[str, np.ndarray]:
        return from_state_dict({k: v.cpu() for k, v in self.global_model.state_dict().items()})


def add_arguments(parser) -> None:
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads(N) if N > 0; default: torch's own default")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")


def describe(args) -> dict:
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    about = {"name": NAME, "torch_version": torch.__version__,
             "torch_num_threads": torch.get_num_threads(), "torch_device": args.device}
    if args.device.startswith("cuda"):
        about["cuda_device_name"] = torch.cuda.get_device_name(torch.device(args.device))
    return about


if __name__ == "__main__":
    sys.exit(harness.main(lambda work, args: TorchCNNRunner(work, args.device), describe,
                          add_arguments, workload=cw))
