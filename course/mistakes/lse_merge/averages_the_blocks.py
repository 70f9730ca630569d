"""the blocks' outputs averaged instead of weighted by their softmax mass.

Each block's output is normalised over its own keys only: weigh it by exp(block_lse - new_lse),
its share of the merged softmax denominator, and the running output by exp(lse - new_lse).
"""

from __future__ import annotations

import torch


def merge_into(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor,
               block_lse: torch.Tensor) -> None:
    out.add_(block_out).mul_(0.5)
    lse.copy_(torch.logaddexp(lse, block_lse))
