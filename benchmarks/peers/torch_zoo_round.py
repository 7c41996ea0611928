"""One FedAvg round of a zoo workload (`zoo_workload.py`) as a plain PyTorch per-client loop.

    .venv/bin/python benchmarks/peers/torch_zoo_round.py --model resnet18-gn --rounds 3
    .venv/bin/python benchmarks/peers/torch_zoo_round.py --model char-lstm --check --quick

The loop of ``torch_cnn_round.py`` (one reused client model, ``load_state_dict`` of the global
weights, a fresh ``torch.optim.SGD(lr=0.01)``, 5 steps on tensor slices of 10 rows, a cloned
``state_dict`` kept per client, then the key-wise mean), on mcfl's zoo models written the
way PyTorch FL code writes them (NCHW images, converted once outside the timing):

- ``cnn-cifar``: ``nn.Conv2d(padding=2)``, ``F.max_pool2d(3, 2, padding=1)`` (TensorFlow's
  'SAME' pool pads only after: the same output size and cost), dense 4096-384-192-10.
- ``resnet18-gn``: the CIFAR ResNet-18 with ``nn.GroupNorm(2, C)`` and bias-free convolutions.
- ``char-lstm``: ``nn.Embedding(80, 8)``, ``nn.LSTM(num_layers=2, batch_first=True)``, a dense
  layer on the last step. ``nn.LSTM`` has two biases per layer where mcfl (and TensorFlow's
  BasicLSTMCell, LEAF's) has one and a constant forget bias of 1: ``bias_hh`` is frozen at
  that constant (1 on the forget gate, 0 elsewhere), so the function and the trainable
  parameter count are mcfl's.

CPU, float32, torch's default thread count unless ``--threads N``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import zoo_workload as zw  # noqa: E402
from torch import nn  # noqa: E402
from torch_fedavg import average_into, train_client  # noqa: E402

NAME = "PyTorch per-client loop"


class CifarCNN(nn.Module):
    def __init__(self, classes: int):
        super().__init__()
        self.conv0 = nn.Conv2d(3, 64, 5, padding=2)
        self.conv1 = nn.Conv2d(64, 64, 5, padding=2)
        side = zw.IMAGE_SHAPE[0] // 4
        self.dense0 = nn.Linear(side * side * 64, 384)
        self.dense1 = nn.Linear(384, 192)
        self.dense2 = nn.Linear(192, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv0(x)), 3, 2, padding=1)
        x = F.max_pool2d(F.relu(self.conv1(x)), 3, 2, padding=1)
        return self.dense2(F.relu(self.dense1(F.relu(self.dense0(x.flatten(1))))))


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c: int, stride: int, groups: int):
        super().__init__()
        self.conv0 = nn.Conv2d(c_in, c, 3, stride, padding=1, bias=False)
        self.norm0 = nn.GroupNorm(groups, c)
        self.conv1 = nn.Conv2d(c, c, 3, 1, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(groups, c)
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c, 1, stride, bias=False),
                                          nn.GroupNorm(groups, c))

    def forward(self, x):
        y = F.relu(self.norm0(self.conv0(x)))
        return F.relu(self.norm1(self.conv1(y)) + self.shortcut(x))


class ResNet18GN(nn.Module):
    def __init__(self, classes: int, width: int = 64, groups: int = 2):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, padding=1, bias=False),
                                  nn.GroupNorm(groups, width), nn.ReLU())
        blocks, c_in = [], width
        for stage in range(4):
            c = width * 2 ** stage
            for b in range(2):
                blocks.append(BasicBlock(c_in, c, 2 if stage > 0 and b == 0 else 1, groups))
                c_in = c
        self.blocks = nn.Sequential(*blocks)
        self.dense = nn.Linear(c_in, classes)

    def forward(self, x):
        return self.dense(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class CharLSTM(nn.Module):
    def __init__(self, classes: int, units: int = 256, embed: int = 8):
        super().__init__()
        self.embed = nn.Embedding(zw.VOCABULARY, embed)
        self.lstm = nn.LSTM(embed, units, num_layers=2, batch_first=True)
        for layer in range(2):  # one trainable bias per gate, a constant forget bias of 1
            bias = getattr(self.lstm, f"bias_hh_l{layer}")
            with torch.no_grad():
                bias.zero_()
                bias[units:2 * units] = 1.0  # PyTorch's gate order is (i, f, g, o)
            bias.requires_grad_(False)
        self.dense = nn.Linear(units, classes)

    def forward(self, x):
        out, _ = self.lstm(self.embed(x))
        return self.dense(out[:, -1])


def build(work: zw.ZooWorkload) -> nn.Module:
    args, k = work.model_args, work.num_classes
    if work.model == "cnn-cifar":
        return CifarCNN(k)
    if work.model == "resnet18-gn":
        return ResNet18GN(k, args.get("width", 64), args.get("groups", 2))
    return CharLSTM(k, args.get("units", 256), args.get("embed", 8))


class TorchZooRunner:
    def __init__(self, work: zw.ZooWorkload):
        self.global_model = build(work)
        self.client_model = build(work)
        self.trainable = [p for p in self.client_model.parameters() if p.requires_grad]
        self.param_count = sum(p.numel() for p in self.trainable)
        if work.model == "char-lstm":
            self.x = torch.from_numpy(work.x.astype(np.int64))
        else:  # [C, rows, H, W, C] -> PyTorch's NCHW, once
            self.x = torch.from_numpy(np.ascontiguousarray(work.x.transpose(0, 1, 4, 2, 3)))
        self.y = torch.from_numpy(work.y.astype(np.int64))

    def train_client(self, c: int) -> dict[str, torch.Tensor]:
        model = self.client_model
        return train_client(self.global_model, model, self.trainable, self.x[c], self.y[c],
                            zw.LOCAL_STEPS, zw.BATCH_SIZE, zw.LEARNING_RATE)

    def run_round(self) -> None:
        average_into(self.global_model, [self.train_client(c) for c in range(self.x.shape[0])])

    def global_params(self) -> dict[str, np.ndarray]:
        return {k: v.detach().numpy().copy() for k, v in self.global_model.state_dict().items()}


def add_arguments(parser) -> None:
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads(N) if N > 0; default: torch's own default")


def describe(args) -> dict:
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    return {"name": NAME, "torch_version": torch.__version__,
            "torch_num_threads": torch.get_num_threads()}


if __name__ == "__main__":
    sys.exit(zw.main(lambda work, args: TorchZooRunner(work), describe, add_arguments))
