"""Rotary position embedding (RoPE, Su et al. 2021): the angles for given positions.

Position p rotates pair i of each query/key head by the angle p * theta^(-2i/head_dim), so the
dot product of a query at p and a key at p' depends only on p - p'. The rotation itself is
`model.kernels.apply_rotary`; here we only compute cos/sin. There is no precomputed table:
the angles are made from the position ids of each call (a few thousand multiplies), so any
length works and left-padded rows simply start counting at their first real token.
"""

from __future__ import annotations

import torch


def rotary_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation angles, each [B, T, head_dim] (the head_dim/2 angles
    written twice, once per half of the pair), cast to `dtype`.

    Angles are computed in fp32 like HF Llama (bf16 positions above 256 would be inexact).
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=position_ids.device)
    inv_freq = 1.0 / (theta ** (exponents.float() / head_dim))
    angles = position_ids.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)
