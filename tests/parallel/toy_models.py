"""Small models and data shared by the DDP tests (parallel/ never imports the real model)."""

from __future__ import annotations

import torch
from torch import nn


def make_mlp(seed: int) -> nn.Sequential:
    """A 3-layer MLP with matrices of different shapes and 1-D parameters (biases, LayerNorm)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.LayerNorm(16), nn.Linear(16, 12),
                         nn.Tanh(), nn.Linear(12, 3))


def make_batch(rank: int, step: int, micro_batch: int, batch_size: int = 6,
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random inputs and targets, different for every (rank, step, micro-batch)."""
    generator = torch.Generator().manual_seed(1000 * rank + 100 * step + micro_batch)
    inputs = torch.randn(batch_size, 10, generator=generator)
    targets = torch.randn(batch_size, 3, generator=generator)
    return inputs, targets


def mse_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return ((model(inputs) - targets) ** 2).mean()
