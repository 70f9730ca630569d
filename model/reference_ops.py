"""Plain-math reference versions of the model's five kernels, used only by tests.

Each one is the formula written out with elementary tensor ops, deliberately *not* sharing code
with `model/kernels.py`, so a test that compares the two (values and gradients) can fail.
"""

from __future__ import annotations

import math

import torch

from utils.labels import IGNORE_INDEX


def attention_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        allowed: torch.Tensor | None) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + mask) V (Vaswani et al. 2017), causal if `allowed` is None.

    query [B, T, H, D]; key/value [B, S, KV, D] with H a multiple of KV (GQA: query head h
    reads key/value head h // (H/KV)); allowed: bool [B, 1, T, S], True = may attend.
    Returns [B, T, H, D].
    """
    group_size = query.shape[2] // key.shape[2]
    query = query.transpose(1, 2)
    key = key.repeat_interleave(group_size, dim=2).transpose(1, 2)
    value = value.repeat_interleave(group_size, dim=2).transpose(1, 2)
    scores = (query.double() @ key.double().transpose(-1, -2)) / math.sqrt(query.shape[-1])
    if allowed is None:
        query_len, key_len = scores.shape[-2:]
        allowed = torch.ones(query_len, key_len, dtype=torch.bool).tril(key_len - query_len)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(dim=-1) @ value.double()).transpose(1, 2).to(query.dtype)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich 2019)."""
    x64 = x.double()
    normed = x64 / torch.sqrt((x64 * x64).mean(dim=-1, keepdim=True) + eps)
    return (normed * weight.double()).to(x.dtype)


def rotary_reference(x: torch.Tensor, position_ids: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE as a complex rotation (Su et al. 2021): pair (x_i, x_{i+D/2}) is the complex number
    x_i + j*x_{i+D/2}, multiplied by e^{j * position * theta^(-2i/D)}.

    x [B, T, H, D] with the "half split" pairing that HF Llama's rotate_half uses;
    position_ids [B, T].
    """
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(0, half, dtype=torch.float64) * 2 / x.shape[-1])
    angles = position_ids.double()[..., None] * inv_freq  # [B, T, D/2]
    rotation = torch.polar(torch.ones_like(angles), angles)[:, :, None, :]  # [B, T, 1, D/2]
    pairs = torch.complex(x[..., :half].double(), x[..., half:].double()) * rotation
    return torch.cat([pairs.real, pairs.imag], dim=-1).to(x.dtype)


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate * sigmoid(gate) * up (Shazeer 2020)."""
    return gate * (1.0 / (1.0 + torch.exp(-gate))) * up


def cross_entropy_reference(hidden: torch.Tensor, weight: torch.Tensor,
                            labels: torch.Tensor) -> torch.Tensor:
    """Mean over labels != -100 of -log softmax(hidden @ weight^T)[label], full logits at once."""
    logits = (hidden @ weight.T).double()
    log_probs = logits - logits.logsumexp(dim=-1, keepdim=True)
    valid = labels != IGNORE_INDEX
    picked = log_probs.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    return (-(picked * valid).sum() / valid.sum()).to(torch.float32)
