"""Fake flash-attn 2 (>= 2.1): `flash_attn_func` and `flash_attn_varlen_func` in plain torch.

Semantics (flash-attn's docstrings): q [B, T, H, D], k/v [B, S, KV, D] with H % KV == 0 (GQA:
query head h reads key/value head h // (H / KV)); scale 1/sqrt(D) by default; causal=True masks
with the diagonal aligned to the bottom-right corner of the T x S score matrix, so query i sees
key j iff j <= i + S - T (a query that sees no key outputs 0). The varlen form packs the rows
end to end: q [total_q, H, D], rows delimited by int32 `cu_seqlens` [B + 1].
`return_attn_probs=True` (without dropout) returns (out, softmax_lse, S_dmask) as the real
functions do: the log-sum-exp of each row's scaled scores in fp32, [B, H, T] from
`flash_attn_func`, [H, total_q] from `flash_attn_varlen_func` (flash-attn >= 2.6; before,
padded per sequence, [B, H, max_seqlen_q], the padding unwritten: NaN here), +inf on a row
that sees no key (the kernel's `normalize_softmax_lse`), and an empty S_dmask (probabilities
are only kept with dropout).
Like the real package: below version 2.1 (set `__version__`) the causal diagonal is aligned to
the top-left corner (query i sees key j iff j <= i), and every call on a GPU of compute
capability below 8.0 raises.
"""

from __future__ import annotations

import math

import torch

from tests import fake_gpu_libs
from tests.fake_gpu_libs import CALLS, check_on_gpu

__version__ = "2.8.3"
MAX_HEAD_DIM = 256


def _version() -> tuple[int, int]:
    major, minor = (int(part) for part in __version__.split(".")[:2])
    return major, minor


def _bottom_right_causal() -> bool:
    return _version() >= (2, 1)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    check_on_gpu(q, k, v)
    if fake_gpu_libs.device_capability(q.device) < (8, 0):
        raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise RuntimeError("query and key must have the same dtype")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise RuntimeError("FlashAttention forward only supports head dimension at most 256")
    if k.shape != v.shape or k.shape[-1] != q.shape[-1]:
        raise RuntimeError("key and value must have the same shape and head dim as query")
    if q.shape[-2] % k.shape[-2] != 0:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")


def _maybe_contiguous(x: torch.Tensor) -> torch.Tensor:
    """The real wrapper copies only tensors whose last dimension is strided."""
    return x.contiguous() if x.stride(-1) != 1 else x


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
            dropout_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q [T, H, D], k/v [S, KV, D] -> (out [T, H, D], lse fp32 [H, T]), fp32
    inside."""
    group = q.shape[1] // k.shape[1]
    qf = q.float().transpose(0, 1)
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = qf @ kf.transpose(-1, -2) * scale
    seqlen_q, seqlen_k = q.shape[0], k.shape[0]
    if causal:
        diagonal = seqlen_k - seqlen_q if _bottom_right_causal() else 0
        visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool,
                             device=q.device).tril(diagonal)
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.nan_to_num(scores.softmax(dim=-1), nan=0.0)  # no visible key: output 0
    else:
        probs = scores.softmax(dim=-1)
    lse = scores.logsumexp(dim=-1)
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))  # no visible key: +inf
    if dropout_p > 0:
        probs = torch.nn.functional.dropout(probs, dropout_p)
    return (probs @ vf).transpose(0, 1).to(q.dtype), lse


def _check_returned_probs(return_attn_probs: bool, dropout_p: float) -> None:
    if return_attn_probs and dropout_p > 0:
        raise NotImplementedError("not emulated: the dropout pattern in returned probs")


def _with_lse(out: torch.Tensor, lse: torch.Tensor, return_attn_probs: bool):
    """What the real functions return: out, or (out, softmax_lse, empty S_dmask)."""
    if not return_attn_probs:
        return out
    return out, lse, torch.empty((0,), dtype=out.dtype, device=out.device)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    CALLS["flash_attn_func"] += 1
    if window_size != (-1, -1) or alibi_slopes is not None:
        raise NotImplementedError("not emulated: sliding window, ALiBi")
    _check_returned_probs(return_attn_probs, dropout_p)
    q, k, v = map(_maybe_contiguous, (q, k, v))
    _check(q, k, v)
    if q.dim() != 4 or k.dim() != 4 or k.shape[0] != q.shape[0]:
        raise RuntimeError("q must be [batch, seqlen_q, heads, dim], k/v [batch, seqlen_k, ...]")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    rows = [_attend(q[b], k[b], v[b], scale, causal, dropout_p) for b in range(q.shape[0])]
    return _with_lse(torch.stack([out for out, _ in rows]),
                     torch.stack([lse for _, lse in rows]), return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           alibi_slopes=None, deterministic=False, return_attn_probs=False,
                           block_table=None):
    CALLS["flash_attn_varlen_func"] += 1
    if window_size != (-1, -1) or alibi_slopes is not None or block_table:
        raise NotImplementedError("not emulated: sliding window, ALiBi, paged KV")
    _check_returned_probs(return_attn_probs, dropout_p)
    q, k, v = map(_maybe_contiguous, (q, k, v))
    _check(q, k, v)
    if q.dim() != 3 or k.dim() != 3:
        raise RuntimeError("varlen q must be [total_q, heads, dim], k/v [total_k, heads, dim]")
    for name, cu, total, max_len in (("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q),
                                     ("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k)):
        if cu.dtype != torch.int32:
            raise RuntimeError(f"{name} must have dtype int32")
        if cu.dim() != 1 or not cu.is_contiguous() or cu.device != q.device:
            raise RuntimeError(f"{name} must be a contiguous 1-D tensor on q's device")
        lengths = cu.diff()
        if int(cu[0]) != 0 or int(cu[-1]) != total or bool((lengths < 0).any()):
            raise RuntimeError(f"{name} must rise from 0 to the packed length {total}")
        if int(lengths.max()) > max_len:  # the kernel would skip tokens past max_seqlen
            raise RuntimeError(f"a sequence is longer than its max_seqlen {max_len}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise RuntimeError("cu_seqlens_q and cu_seqlens_k must describe the same batch")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    rows = [_attend(q[starts_q[b]:starts_q[b + 1]], k[starts_k[b]:starts_k[b + 1]],
                    v[starts_k[b]:starts_k[b + 1]], scale, causal, dropout_p)
            for b in range(len(starts_q) - 1)]
    out = torch.cat([row_out for row_out, _ in rows])
    if _version() >= (2, 6):  # unpadded: [H, total_q]
        return _with_lse(out, torch.cat([lse for _, lse in rows], dim=1), return_attn_probs)
    padded = torch.full((len(rows), q.shape[1], max_seqlen_q), float("nan"), device=q.device)
    for b, (_, lse) in enumerate(rows):
        padded[b, :, :lse.shape[1]] = lse
    return _with_lse(out, padded, return_attn_probs)
