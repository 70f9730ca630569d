"""the running log-sum-exp not updated after a merge.

The next block is weighed against the denominator of everything merged so far: after the merge,
lse must become logaddexp(lse, block_lse).
"""

from __future__ import annotations

import torch


def merge_into(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor,
               block_lse: torch.Tensor) -> None:
    new_lse = torch.logaddexp(lse, block_lse)
    out.mul_(torch.exp(lse - new_lse)[..., None]).add_(
        block_out * torch.exp(block_lse - new_lse)[..., None])
