"""rotated by -angle (the sign of rotate_half flipped).

A rotation by +theta maps (a, b) to (a cos - b sin, b cos + a sin): rotate_half(x) is
cat(-second, first), not cat(second, -first).
"""

from __future__ import annotations

import torch


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    rotated_half = torch.cat([second, -first], dim=-1)
    return x * cos[:, :, None, :] + rotated_half * sin[:, :, None, :]
