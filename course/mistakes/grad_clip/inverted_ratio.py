"""the clip factor inverted (total_norm / max_norm).

Clipping scales every gradient by max_norm / total_norm, and only when that is below 1: the
clipped norm is then max_norm.
"""

from __future__ import annotations

import torch
from torch import Tensor

from optimizer.clip_grads import _CLIP_EPS


def clip_grads_(grads: list[Tensor], max_norm: float, total_norm: float) -> None:
    clip_coef = (total_norm + _CLIP_EPS) / max_norm
    if clip_coef > 1.0 and grads:
        torch._foreach_mul_(grads, clip_coef)
