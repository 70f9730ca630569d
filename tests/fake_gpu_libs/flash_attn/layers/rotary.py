"""Fake `flash_attn.layers.rotary.apply_rotary_emb` (non-interleaved, out of place).

x [B, T, H, D]; cos/sin [seqlen_ro, rotary_dim / 2], seqlen_ro >= T, rotary_dim <= D; x and
cos/sin of one dtype. Non-interleaved (GPT-NeoX style) rotates the pair (x_i, x_{i + r/2}) of
the first r = rotary_dim features; the rest pass through. Computed in fp32, returned in x's dtype.
"""

from __future__ import annotations

import torch

from tests.fake_gpu_libs import CALLS, check_on_gpu


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    CALLS["apply_rotary_emb"] += 1
    if interleaved or inplace or cu_seqlens is not None or not isinstance(seqlen_offsets, int):
        raise NotImplementedError("not emulated: interleaved, inplace, varlen, tensor offsets")
    check_on_gpu(x, cos, sin)
    batch, seqlen, heads, head_dim = x.shape
    seqlen_ro, half = cos.shape
    if sin.shape != cos.shape:
        raise AssertionError("cos and sin must have the same shape")
    if not 2 * half <= head_dim <= 256:
        raise AssertionError("rotary_dim must be <= headdim <= 256")
    if seqlen_ro < seqlen + seqlen_offsets:
        raise AssertionError("seqlen_ro must be >= seqlen")
    if cos.dtype != sin.dtype or x.dtype != cos.dtype:
        raise AssertionError(f"Input and cos/sin must have the same dtype, got {x.dtype} and "
                             f"{cos.dtype}")
    cos = cos[seqlen_offsets:seqlen_offsets + seqlen, None, :].float()
    sin = sin[seqlen_offsets:seqlen_offsets + seqlen, None, :].float()
    first, second = x[..., :half].float(), x[..., half:2 * half].float()
    rotated = torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)
    return torch.cat([rotated.to(x.dtype), x[..., 2 * half:]], dim=-1)
