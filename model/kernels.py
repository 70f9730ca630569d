"""Kernel dispatch: the model's five hot ops, each run by the fastest implementation present.

    op             CUDA + package present                 otherwise (CPU, or no package)
    attention      flash-attn `flash_attn_func`            torch `F.scaled_dot_product_attention`
                   (`flash_attn_varlen_func` when padded)  (with a boolean mask when padded)
    rms_norm       apex `fused_rms_norm_affine`            torch `F.rms_norm` in fp32
    rotary         flash-attn `apply_rotary_emb`           torch, half-split rotation
    swiglu         flash-attn `ops.activations.swiglu`     torch `F.silu(gate) * up`
    cross_entropy  chunked fused linear + loss (ours, `model/chunked_lm_head.py`) everywhere

The choice is made from the tensors' device and dtype (a CPU model and a GPU model in one
process both work); `kernel_choices` says which one runs and, when it is not the fastest, why.
A package counts only if it will run (`utils/gpu_libraries.py`): flash-attn >= 2.1 on compute
capability >= 8.0, apex with its compiled CUDA extensions.
Rows with their own positions (a padded batch) take the torch rotary path: flash-attn's kernel
takes one position table for the whole batch. Implementations never own parameters, so the
state dict is the same whichever kernel runs. `model/reference_ops.py` holds a plain-math
version of each op; the tests check every torch path against it, and every GPU path against
plain-torch emulations of the libraries (tests/fake_gpu_libs), values and grads.

Layout: activations are token-major, [batch, seq, heads, head_dim], as flash-attn wants.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from model.sequence_shard import SequenceShard
from utils.gpu_libraries import (
    OptionalImport,
    apex_extension_problem,
    flash_attn_problem,
    import_flash_attn,
    import_optional,
    runs_gpu_kernels,
)


@dataclass(frozen=True)
class GpuKernels:
    flash_attn_func: OptionalImport
    flash_attn_varlen_func: OptionalImport
    apply_rotary_emb: OptionalImport
    swiglu: OptionalImport
    fused_rms_norm_affine: OptionalImport


def find_gpu_kernels() -> GpuKernels:
    """Import the optional kernels that will run (once at import; the tests re-run it on
    emulations): flash-attn >= 2.1, apex with its compiled norm extension."""
    return GpuKernels(
        flash_attn_func=import_flash_attn("flash_attn_func"),
        flash_attn_varlen_func=import_flash_attn("flash_attn_varlen_func"),
        apply_rotary_emb=import_optional("flash_attn.layers.rotary", "apply_rotary_emb"),
        swiglu=import_optional("flash_attn.ops.activations", "swiglu"),
        fused_rms_norm_affine=import_optional(
            "apex.normalization.fused_layer_norm", "fused_rms_norm_affine",
            lambda: apex_extension_problem("fused_layer_norm_cuda")))


gpu_kernels = find_gpu_kernels()


def _why_not(kernel: OptionalImport, device: torch.device) -> str:
    """'' if `kernel` serves `device`, else the reason it does not."""
    if kernel.value is None:
        return kernel.missing_reason
    return "" if runs_gpu_kernels(device) else f"{device.type}: no GPU kernel"


def why_not_flash_attention(device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """'' if flash-attn runs attention for these activations, else why it does not."""
    return (gpu_kernels.flash_attn_func.missing_reason
            or gpu_kernels.flash_attn_varlen_func.missing_reason
            or flash_attn_problem(device, dtype, head_dim))


def kernel_choices(device: torch.device, dtype: torch.dtype, head_dim: int) -> dict[str, str]:
    """Each op's implementation for activations on `device` in `dtype`, with the reason in
    parentheses when a faster one is not used (printed at the start of every run)."""

    def choice(fast: str, slow: str, reason: str) -> str:
        return f"{slow} ({reason})" if reason else fast

    return {
        "attention": choice("flash-attn (varlen for padded batches)", "torch-sdpa",
                            why_not_flash_attention(device, dtype, head_dim)),
        "rms_norm": choice("apex-fused", "torch-fp32",
                           _why_not(gpu_kernels.fused_rms_norm_affine, device)),
        "rotary": choice("flash-attn (torch for padded batches)", "torch",
                         _why_not(gpu_kernels.apply_rotary_emb, device)),
        "swiglu": choice("flash-attn", "torch", _why_not(gpu_kernels.swiglu, device)),
        "cross_entropy": "chunked-torch",
    }


# ---- attention ----------------------------------------------------------------------------

@dataclass(frozen=True)
class PackedTokens:
    """Where the real tokens of a padded batch are, for flash-attn's variable-length kernel:
    (row, column) of every real query and key, and the offsets of each row once packed end to
    end (`cu_seqlens`, int32 [B + 1]: row b owns packed tokens cu[b]..cu[b+1]-1). Example, a
    right-padded batch of 2 rows (A B C, D E), no KV cache, so queries and keys coincide:

        mask [[1, 1, 1, 0],    rows [0, 0, 0, 1, 1]   packed  A B C D E
              [1, 1, 0, 0]]    cols [0, 1, 2, 0, 1]   cu_seqlens [0, 3, 5], max_seqlen 3
    """
    query_rows: torch.Tensor
    query_cols: torch.Tensor
    key_rows: torch.Tensor
    key_cols: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int


@dataclass(frozen=True)
class AttentionLayout:
    """How the queries of one forward attend, decided once per forward for every layer.

    kernel "flash": no padding, causal (bottom-right aligned, so T new queries after a KV cache
    see every cached key); "flash-varlen": padded, `packed` says where the real tokens are;
    "sdpa": torch, with `allowed` (bool [B, 1, T, S], True = may attend) or `is_causal`;
    "ring": context parallelism, this rank's share of every sequence attends to all of it
    around the group's ring (`context.attention`; `sample_ids` this rank's share of the key
    padding mask, None when unpadded).
    """
    kernel: str
    allowed: torch.Tensor | None = None
    is_causal: bool = False
    packed: PackedTokens | None = None
    context: SequenceShard | None = None
    sample_ids: torch.Tensor | None = None


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              layout: AttentionLayout, dropout_p: float = 0.0) -> torch.Tensor:
    """Scaled dot-product attention with grouped key/value heads.

    query [B, T, H, D]; key/value [B, S, KV, D] (H a multiple of KV); returns [B, T, H, D].
    """
    if layout.kernel == "flash":
        return gpu_kernels.flash_attn_func.value(query, key, value, dropout_p=dropout_p,
                                                 causal=True)
    if layout.kernel == "flash-varlen":
        return _flash_attention_varlen(query, key, value, layout.packed, dropout_p)
    if layout.kernel == "ring":  # no dropout: refused with context parallelism
        return layout.context.attention(query, key, value, layout.sample_ids)
    # SDPA wants [B, heads, seq, D]; enable_gqa shares each key/value head with its group of
    # query heads without materialising repeated copies.
    out = F.scaled_dot_product_attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
        attn_mask=layout.allowed, dropout_p=dropout_p, is_causal=layout.is_causal,
        enable_gqa=key.shape[2] != query.shape[2])
    return out.transpose(1, 2)


def _flash_attention_varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            packed: PackedTokens, dropout_p: float) -> torch.Tensor:
    """Unpad (keep the real tokens, rows end to end), attend within each row, re-pad with
    zeros: padding costs no attention FLOPs, and a padded query's output is 0."""
    out = gpu_kernels.flash_attn_varlen_func.value(
        query[packed.query_rows, packed.query_cols], key[packed.key_rows, packed.key_cols],
        value[packed.key_rows, packed.key_cols], packed.cu_seqlens_q, packed.cu_seqlens_k,
        packed.max_seqlen_q, packed.max_seqlen_k, dropout_p=dropout_p, causal=True)
    return query.new_zeros(query.shape).index_put((packed.query_rows, packed.query_cols), out)


# ---- the pointwise ops --------------------------------------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32 whatever the input dtype (the mean of squares of bf16 values
    loses too much precision), returned in the input dtype. apex's kernel also accumulates in
    fp32; it needs input and weight in one dtype, and under autocast it casts both to the
    autocast dtype (so its output is bf16 where torch's is fp32)."""
    if (gpu_kernels.fused_rms_norm_affine.value is not None and runs_gpu_kernels(x.device)
            and x.dtype == weight.dtype):
        return gpu_kernels.fused_rms_norm_affine.value(x, weight, weight.shape, eps)
    return F.rms_norm(x.float(), weight.shape, weight.float(), eps).to(x.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_i, x_{i+D/2}) by the angle whose cos/sin are given.

    x [B, T, H, D]; cos/sin [B or 1, T, D] (both halves equal; 1 row when every row has the
    same positions). This "half split" pairing is HF Llama's `rotate_half` convention (flash-attn
    calls it non-interleaved), so weights convert to and from `LlamaForCausalLM` without
    permuting q/k rows. Written as x*cos + rotate_half(x)*sin: full-width multiplies are faster
    than four half-width ones.
    """
    if (gpu_kernels.apply_rotary_emb.value is not None and runs_gpu_kernels(x.device)
            and cos.shape[0] == 1):
        half = x.shape[-1] // 2
        return gpu_kernels.apply_rotary_emb.value(x, cos[0, :, :half], sin[0, :, :half],
                                                  interleaved=False)
    first, second = x.chunk(2, dim=-1)
    rotated_half = torch.cat([-second, first], dim=-1)
    return x * cos[:, :, None, :] + rotated_half * sin[:, :, None, :]


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up, the gated unit of the llama MLP (Shazeer 2020)."""
    if gpu_kernels.swiglu.value is not None and runs_gpu_kernels(gate.device):
        return gpu_kernels.swiglu.value(gate, up)
    return F.silu(gate) * up
