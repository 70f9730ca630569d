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

import importlib.util

import torch
import torch.nn.functional as F

# Optional GPU packages: imported only if installed; their absence is the normal CPU case.
if importlib.util.find_spec("flash_attn") is not None:
    from flash_attn import flash_attn_func
    from flash_attn.layers.rotary import apply_rotary_emb as flash_apply_rotary_emb
    from flash_attn.ops.activations import swiglu as flash_swiglu
else:
    flash_attn_func = flash_apply_rotary_emb = flash_swiglu = None
if importlib.util.find_spec("apex") is not None:
    from apex.normalization.fused_layer_norm import fused_rms_norm_affine
else:
    fused_rms_norm_affine = None

_HALF_DTYPES = (torch.float16, torch.bfloat16)


def kernel_names(device: torch.device, dtype: torch.dtype) -> dict[str, str]:
    """Which implementation each op uses for tensors on `device` in `dtype` (for the log)."""
    cuda = device.type == "cuda"
    flash = cuda and flash_attn_func is not None
    return {
        "attention": "flash-attn" if flash and dtype in _HALF_DTYPES else "torch-sdpa",
        "rms_norm": "apex-fused" if cuda and fused_rms_norm_affine is not None else "torch",
        "rotary": "flash-attn" if flash else "torch",
        "swiglu": "flash-attn" if flash else "torch",
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
    loses too much precision), returned in the input dtype."""
    if fused_rms_norm_affine is not None and x.is_cuda:
        return fused_rms_norm_affine(x, weight, weight.shape, eps)
    return F.rms_norm(x.float(), weight.shape, weight.float(), eps).to(x.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x_i, x_{i+D/2}) by the angles whose cos/sin are given.

    x [B, T, H, D]; cos/sin [B or 1, T, D/2] (1 when every row has the same positions). This
    "half split" pairing is HF Llama's `rotate_half` convention, so weights convert to and from
    `LlamaForCausalLM` without permuting q/k rows.
    """
    if flash_apply_rotary_emb is not None and x.is_cuda and cos.shape[0] == 1:
        return flash_apply_rotary_emb(x, cos[0], sin[0], interleaved=False)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up, the gated unit of the llama MLP (Shazeer 2020)."""
    if flash_swiglu is not None and gate.is_cuda:
        return flash_swiglu(gate, up)
    return F.silu(gate) * up
