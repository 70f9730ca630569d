"""the mean of squares taken over every dimension, not over each vector's last one.

RMSNorm normalises each token's hidden vector on its own: mean(x^2) over dim=-1 with
keepdim=True, one scale per token.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean() + eps)
    return (normed * weight.float()).to(x.dtype)
