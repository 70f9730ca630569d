"""Rotary position embedding (RoPE, Su et al. 2021): the angles for given positions.

Position p rotates pair i of each query/key head by the angle p * f_i, f_i = theta^(-2i/head_dim),
so the dot product of a query at p and a key at p' depends only on p - p'. The rotation itself
is `model.kernels.apply_rotary`; here we only compute cos/sin. There is no precomputed table:
the angles are made from the position ids of each call (a few thousand multiplies), so any
length works and left-padded rows simply start counting at their first real token.

Pretrained models stretch RoPE to a longer context than they were trained on by slowing some
frequencies down (`Z2allConfig.rope_scaling`, HF's names):

    rope_type  what happens to each frequency f_i (wavelength w_i = 2*pi / f_i)
    linear     f_i / factor for every i ("position interpolation", Chen et al. 2023)
    llama3     Llama 3.1: with L = original_max_position_embeddings,
               w_i < L / high_freq_factor (fast, local detail): f_i unchanged;
               w_i > L / low_freq_factor (slow, long range):    f_i / factor;
               in between: the mix (1 - s) * f_i / factor + s * f_i,
               s = (L / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor).
"""

from __future__ import annotations

import math
from typing import Any

import torch

SCALING_TYPES = ("linear", "llama3")


def inverse_frequencies(head_dim: int, theta: float,
                        scaling: dict[str, Any] | None = None) -> torch.Tensor:
    """f_i for the head_dim/2 pairs (fp32), scaled as the module docstring says."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64)
    inv_freq = 1.0 / (theta ** (exponents.float() / head_dim))
    if scaling is None:
        return inv_freq
    rope_type, factor = scaling["rope_type"], scaling["factor"]
    if rope_type == "linear":
        return inv_freq / factor
    if rope_type != "llama3":
        raise ValueError(f"rope_scaling type {rope_type!r} is not one of {SCALING_TYPES}")
    original_length = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelength = 2 * math.pi / inv_freq
    mix = (original_length / wavelength - low) / (high - low)
    scaled = torch.where(wavelength > original_length / low, inv_freq / factor, inv_freq)
    in_between = (wavelength >= original_length / high) & (wavelength <= original_length / low)
    return torch.where(in_between, (1 - mix) * inv_freq / factor + mix * inv_freq, scaled)


def rotary_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float,
                   dtype: torch.dtype, scaling: dict[str, Any] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation angles, each [B, T, head_dim] (the head_dim/2 angles
    written twice, once per half of the pair), cast to `dtype`.

    Angles are computed in fp32 like HF Llama (bf16 positions above 256 would be inexact).
    """
    inv_freq = inverse_frequencies(head_dim, theta, scaling).to(position_ids.device)
    angles = position_ids.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)
