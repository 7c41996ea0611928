"""The PyTorch side of a FedAvg round, shared by the peers' per-client loops
(torch_cnn_round.py, torch_zoo_round.py): each client copies the global model, takes `steps`
SGD steps on its consecutive batches, and the server averages the clients' state dicts."""

from __future__ import annotations

import torch
from torch import nn


def train_client(global_model: nn.Module, client_model: nn.Module, parameters, x, y,
                 steps: int, batch: int, lr: float) -> dict[str, torch.Tensor]:
    """One client's local SGD from the global model (on `parameters` of `client_model`);
    its state dict afterwards."""
    client_model.load_state_dict(global_model.state_dict())
    optimizer = torch.optim.SGD(parameters, lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    client_model.train()
    for s in range(steps):
        rows = slice(s * batch, (s + 1) * batch)
        optimizer.zero_grad()
        loss_fn(client_model(x[rows]), y[rows]).backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in client_model.state_dict().items()}


def average_into(global_model: nn.Module, states: list[dict[str, torch.Tensor]]) -> None:
    """The plain mean of the clients' state dicts, loaded into the global model."""
    global_model.load_state_dict(
        {k: torch.stack([s[k] for s in states]).mean(dim=0) for k in states[0]})
