"""Shared pieces for optimizer tests: a tiny model, a one-process stand-in for our DDP, and the
reference every wrapper is compared with (torch AdamW + torch's clip_grad_norm_)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from optimizer import OptimizerConfig


class TinyNet(nn.Module):
    """Matrices (weight-decayed) and vectors (biases, a norm-like gain: not decayed)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.gain = nn.Parameter(1 + 0.1 * torch.randn(width))
        self.out = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.inp(x)) * self.gain)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return (model(inputs).float() - targets).square().mean()


def random_batches(num_steps: int, batch_size: int, seed: int) -> list[tuple]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch_size, 8, generator=generator),
             torch.randn(batch_size, 4, generator=generator)) for _ in range(num_steps)]


class OneProcessDDP(nn.Module):
    """What our DDP does with one rank, for tests that must not depend on it: every param gets a
    `main_grad` buffer; `finish_grad_sync` moves `.grad` into it."""

    def __init__(self, module: nn.Module, grad_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.module = module
        self.process_group = None  # every rank: the only one
        self.config = SimpleNamespace(use_distributed_optimizer=False)
        for param in module.parameters():
            param.main_grad = torch.zeros_like(param, dtype=grad_dtype or param.dtype)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_grad_sync(self) -> None:
        for param in self.module.parameters():
            param.main_grad.add_(param.grad)
            param.grad = None

    def zero_grad_buffer(self) -> None:
        for param in self.module.parameters():
            param.main_grad.zero_()


def reference_adamw(model: nn.Module, config: OptimizerConfig) -> torch.optim.AdamW:
    """torch AdamW with the same groups our wrappers build (no decay for ndim < 2)."""
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2),
                             eps=config.adam_eps)


def reference_step(model: nn.Module, adamw: torch.optim.AdamW, batch, clip_grad: float) -> float:
    """One plain-PyTorch training step; returns the pre-clip grad norm."""
    adamw.zero_grad()
    loss_fn(model, batch).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad if clip_grad else 1e30)
    adamw.step()
    return float(norm)
