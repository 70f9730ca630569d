"""Causal self-attention with grouped key/value heads (GQA), RoPE and an optional KV cache.

Also the helpers that turn a padding mask into what attention needs: position ids, and either
the boolean "who may attend to whom" mask (torch SDPA) or where the real tokens are (flash-attn's
variable-length kernel, which packs them end to end and skips the padding). Worked example,
a left-padded batch of two prompts:

    attention_mask  [[0, 0, 1, 1],      position_ids  [[0, 0, 0, 1],
                     [1, 1, 1, 1]]                     [0, 1, 2, 3]]

so each prompt's first real token is at position 0 whatever its padding. Queries attend to
earlier real tokens; with SDPA a pad query attends to itself only, which keeps its row of the
softmax from being empty (an all -inf row would give NaN, and NaN * 0 still poisons real rows);
flash-attn's varlen path drops pad queries and gives them output 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model import kernels
from model.configuration_z2all import Z2allConfig
from model.kv_cache import KVCache


def position_ids_for(key_padding_mask: torch.Tensor | None, query_len: int, past_len: int,
                     device: torch.device) -> torch.Tensor:
    """Positions of the `query_len` newest tokens: [1, T] without padding, else [B, T]
    counting real tokens only. `key_padding_mask` [B, past_len + query_len], 1 = real."""
    if key_padding_mask is None:
        return torch.arange(past_len, past_len + query_len, device=device)[None]
    return (key_padding_mask.long().cumsum(dim=-1) - 1).clamp(min=0)[:, past_len:]


def attention_mask_for(key_padding_mask: torch.Tensor | None, query_len: int, past_len: int,
                       device: torch.device) -> tuple[torch.Tensor | None, bool]:
    """(allowed [B, 1, T, S] bool or None, is_causal) for T new queries after past_len keys."""
    if key_padding_mask is None:
        if past_len == 0 or query_len == 1:  # plain causal, or one query that sees everything
            return None, past_len == 0 and query_len > 1
        key_padding_mask = torch.ones(1, past_len + query_len, dtype=torch.bool, device=device)
    query_pos = torch.arange(past_len, past_len + query_len, device=device)[:, None]
    key_pos = torch.arange(past_len + query_len, device=device)[None, :]
    is_self = key_pos == query_pos
    allowed = (key_pos <= query_pos) & (key_padding_mask.bool()[:, None, :] | is_self)
    return allowed[:, None], False


def packed_tokens_for(key_padding_mask: torch.Tensor, query_len: int) -> kernels.PackedTokens:
    """Real-token coordinates and per-row offsets of a padded batch (flash-attn varlen). The
    queries are the newest `query_len` keys, so each row's real queries are its last real keys,
    which is what flash-attn's bottom-right aligned causal mask assumes."""
    query_mask = key_padding_mask[:, -query_len:].bool()
    key_mask = key_padding_mask.bool()

    def offsets(mask: torch.Tensor) -> torch.Tensor:
        return F.pad(mask.sum(dim=1).cumsum(dim=0), (1, 0)).to(torch.int32)

    query_rows, query_cols = query_mask.nonzero(as_tuple=True)
    key_rows, key_cols = key_mask.nonzero(as_tuple=True)
    return kernels.PackedTokens(
        query_rows, query_cols, key_rows, key_cols, offsets(query_mask), offsets(key_mask),
        max_seqlen_q=int(query_mask.sum(dim=1).max()), max_seqlen_k=int(key_mask.sum(dim=1).max()))


def attention_layout_for(key_padding_mask: torch.Tensor | None, query_len: int, past_len: int,
                         device: torch.device, use_flash: bool) -> kernels.AttentionLayout:
    """Everything attention needs about masking, computed once per forward."""
    if use_flash and key_padding_mask is None:
        return kernels.AttentionLayout("flash")
    if use_flash:
        return kernels.AttentionLayout(
            "flash-varlen", packed=packed_tokens_for(key_padding_mask, query_len))
    allowed, is_causal = attention_mask_for(key_padding_mask, query_len, past_len, device)
    return kernels.AttentionLayout("sdpa", allowed=allowed, is_causal=is_causal)


class Attention(nn.Module):
    """q/k/v projections are one matrix `qkv_proj` (rows: H query heads, then KV key heads,
    then KV value heads) so they are a single GEMM; split for HF in `hf_llama_mapping.py`."""

    def __init__(self, config: Z2allConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.dropout = config.dropout
        qkv_size = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, qkv_size, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                layout: kernels.AttentionLayout, kv_cache: KVCache | None = None
                ) -> torch.Tensor:
        batch_size, seq_len, _ = hidden.shape
        qkv = self.qkv_proj(hidden).view(batch_size, seq_len, -1, self.head_dim)
        query, key, value = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads],
                                      dim=2)
        query = kernels.apply_rotary(query, cos, sin)
        key = kernels.apply_rotary(key, cos, sin)
        if kv_cache is not None:
            key, value = kv_cache.append(self.layer_idx, key, value)
        out = kernels.attention(query, key, value, layout,
                                dropout_p=self.dropout if self.training else 0.0)
        out = self.o_proj(out.reshape(batch_size, seq_len, -1))
        return F.dropout(out, self.dropout, self.training) if self.dropout else out
