"""RoPE on the wrong halves: pairs (x0, x1), (x2, x3), ... instead of (x_i, x_{i+D/2}).

This model (like HF Llama) pairs dimension i with i + D/2 (rotate_half); the interleaved pairing
(GPT-J, the RoPE paper's notation) is another convention, and gives other values.
"""

from __future__ import annotations

import torch


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    even, odd = x[..., 0::2], x[..., 1::2]
    rotated_half = torch.stack([-odd, even], dim=-1).flatten(-2)
    return x * cos[:, :, None, :] + rotated_half * sin[:, :, None, :]
