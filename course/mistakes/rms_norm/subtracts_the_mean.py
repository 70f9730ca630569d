"""the mean subtracted (that is LayerNorm, not RMSNorm).

RMSNorm divides by the root mean square of x itself; it neither centres x nor has a bias.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    centred = x32 - x32.mean(dim=-1, keepdim=True)
    normed = centred * torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype)
