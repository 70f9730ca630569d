"""RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * weight, no mean subtraction."""

from __future__ import annotations

import torch
from torch import nn

from model import kernels


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight, self.eps)
