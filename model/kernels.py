"""Kernel dispatch: the model's five hot ops, each run by the fastest implementation present.

    op             CUDA + package present                 otherwise (CPU, or no package)
    attention      flash-attn `flash_attn_func`            torch `F.scaled_dot_product_attention`
    rms_norm       apex `fused_rms_norm_affine`            torch `F.rms_norm` in fp32
    rotary         flash-attn `apply_rotary_emb`           torch, half-split rotation
    swiglu         flash-attn `ops.activations.swiglu`     torch `F.silu(gate) * up`
    cross_entropy  chunked fused linear + loss (ours, `model/chunked_lm_head.py`) everywhere

The choice is made per call from the tensor's device and dtype (a CPU model and a GPU model in
one process both work), and a few cases that a fused kernel cannot express (a padding mask, a
different position per row) always take the torch path. Implementations never own parameters,
so the state dict is the same whichever kernel runs. `model/reference_ops.py` holds a
plain-math version of each op; the tests check every fallback against it, values and grads.

Layout: activations are token-major, [batch, seq, heads, head_dim], as flash-attn wants.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F


def _optional(module: str, name: str):
    """`module.name` from an optional GPU package, or None if it is absent or unusable (not
    installed is the normal CPU case; a build for another CUDA/torch raises on import)."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, OSError, RuntimeError):
        return None


flash_attn_func = _optional("flash_attn", "flash_attn_func")
flash_apply_rotary_emb = _optional("flash_attn.layers.rotary", "apply_rotary_emb")
flash_swiglu = _optional("flash_attn.ops.activations", "swiglu")
fused_rms_norm_affine = _optional("apex.normalization.fused_layer_norm",
                                  "fused_rms_norm_affine")

_HALF_DTYPES = (torch.float16, torch.bfloat16)


def kernel_names(device: torch.device, dtype: torch.dtype) -> dict[str, str]:
    """Which implementation each op uses for tensors on `device` in `dtype` (for the log)."""
    cuda = device.type == "cuda"
    return {
        "attention": ("flash-attn" if cuda and flash_attn_func is not None
                      and dtype in _HALF_DTYPES else "torch-sdpa"),  # padded: sdpa
        "rms_norm": "apex-fused" if cuda and fused_rms_norm_affine is not None else "torch",
        "rotary": "flash-attn" if cuda and flash_apply_rotary_emb is not None else "torch",
        "swiglu": "flash-attn" if cuda and flash_swiglu is not None else "torch",
        "cross_entropy": "chunked-torch",
    }


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              allowed: torch.Tensor | None, is_causal: bool, dropout_p: float = 0.0
              ) -> torch.Tensor:
    """Scaled dot-product attention with grouped key/value heads.

    query [B, T, H, D]; key/value [B, S, KV, D]; returns [B, T, H, D].
    allowed: bool [B, 1, T, S] (True = may attend) or None; is_causal: top-left causal mask
    (only used with allowed=None and T == S).
    """
    use_flash = (flash_attn_func is not None and query.is_cuda and allowed is None
                 and query.dtype in _HALF_DTYPES)
    if use_flash:
        return flash_attn_func(query, key, value, dropout_p=dropout_p, causal=is_causal)
    # SDPA wants [B, heads, seq, D]; enable_gqa shares each key/value head with its group of
    # query heads without materialising repeated copies.
    out = F.scaled_dot_product_attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), attn_mask=allowed,
        dropout_p=dropout_p, is_causal=is_causal and allowed is None,
        enable_gqa=key.shape[2] != query.shape[2])
    return out.transpose(1, 2)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32 whatever the input dtype (the mean of squares of bf16 values
    loses too much precision), returned in the input dtype. (apex's kernel also accumulates in
    fp32; it is used only when input and weight share a dtype, which it requires.)"""
    if fused_rms_norm_affine is not None and x.is_cuda and x.dtype == weight.dtype:
        return fused_rms_norm_affine(x, weight, weight.shape, eps)
    return F.rms_norm(x.float(), weight.shape, weight.float(), eps).to(x.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_i, x_{i+D/2}) by the angle whose cos/sin are given.

    x [B, T, H, D]; cos/sin [B or 1, T, D] (both halves equal; 1 row when every row has the
    same positions). This "half split" pairing is HF Llama's `rotate_half` convention, so
    weights convert to and from `LlamaForCausalLM` without permuting q/k rows. Written as
    x*cos + rotate_half(x)*sin: full-width multiplies are faster than four half-width ones.
    """
    if flash_apply_rotary_emb is not None and x.is_cuda and cos.shape[0] == 1:
        half = x.shape[-1] // 2
        return flash_apply_rotary_emb(x, cos[0, :, :half], sin[0, :, :half], interleaved=False)
    first, second = x.chunk(2, dim=-1)
    rotated_half = torch.cat([-second, first], dim=-1)
    return x * cos[:, :, None, :] + rotated_half * sin[:, :, None, :]


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up, the gated unit of the llama MLP (Shazeer 2020)."""
    if flash_swiglu is not None and gate.is_cuda:
        return flash_swiglu(gate, up)
    return F.silu(gate) * up
