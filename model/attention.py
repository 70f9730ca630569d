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

Packed rows (several short samples end to end in one row, dataset/sft_packing.py) use the same
mask with the sample's number instead of 1. Positions restart at each sample, and attention is
block-diagonal: a token sees only earlier tokens of its own sample, as if each sample were
alone in its row:

    attention_mask  [[1, 1, 1, 2, 2, 3, 0]]   position_ids  [[0, 1, 2, 0, 1, 0, 0]]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from model import kernels
from model.configuration_z2all import Z2allConfig
from model.kv_cache import KVCache

if TYPE_CHECKING:
    from parallel.context_parallel.context_shard import ContextShard


def position_ids_for(key_padding_mask: torch.Tensor | None, query_len: int, past_len: int,
                     device: torch.device) -> torch.Tensor:
    """Positions of the `query_len` newest tokens: [1, T] without padding, else [B, T]
    counting the real tokens of each sample from 0. `key_padding_mask` [B, past_len +
    query_len]: 0 = padding, else the token's sample number (1 when a row holds one sample)."""
    if key_padding_mask is None:
        return torch.arange(past_len, past_len + query_len, device=device)[None]
    sample_ids = key_padding_mask.long()
    column = torch.arange(sample_ids.shape[1], device=device).expand_as(sample_ids)
    starts_sample = F.pad(sample_ids[:, 1:] != sample_ids[:, :-1], (1, 0), value=True)
    sample_start = torch.where(starts_sample, column, 0).cummax(dim=-1).values
    return torch.where(sample_ids > 0, column - sample_start, 0)[:, past_len:]


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
    sample_ids = key_padding_mask.long()
    key_sample, query_sample = sample_ids[:, None, :], sample_ids[:, past_len:, None]
    same_sample = (key_sample == query_sample) & (key_sample > 0)
    allowed = (key_pos <= query_pos) & (same_sample | is_self)
    return allowed[:, None], False


def packed_tokens_for(key_padding_mask: torch.Tensor, query_len: int) -> kernels.PackedTokens:
    """Real-token coordinates and offsets of a padded batch (flash-attn varlen): one sequence
    per row, or per sample of a packed row (its samples numbered 1, 2, ... left to right). The
    queries are the newest `query_len` keys, so each row's real queries are its last real keys,
    which is what flash-attn's bottom-right aligned causal mask assumes."""

    samples_per_row = int(key_padding_mask.max())  # 1, or the most samples packed in a row

    def coordinates_and_offsets(sample_ids: torch.Tensor
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        rows, cols = sample_ids.nonzero(as_tuple=True)  # row-major: each sample contiguous
        # Sequence (row, sample) for every real token; the same count of sequences for queries
        # and keys, empty ones included, so their offsets stay aligned.
        sequence = rows * samples_per_row + sample_ids[rows, cols].long() - 1
        lengths = torch.bincount(sequence, minlength=len(sample_ids) * samples_per_row)
        offsets = F.pad(lengths.cumsum(dim=0), (1, 0)).to(torch.int32)
        return rows, cols, offsets, int(lengths.max())

    query_rows, query_cols, query_offsets, max_query = coordinates_and_offsets(
        key_padding_mask[:, -query_len:])
    key_rows, key_cols, key_offsets, max_key = coordinates_and_offsets(key_padding_mask)
    return kernels.PackedTokens(query_rows, query_cols, key_rows, key_cols, query_offsets,
                                key_offsets, max_seqlen_q=max_query, max_seqlen_k=max_key)


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


def context_parallel_layout(context: ContextShard, position_ids: torch.Tensor,
                            key_padding_mask: torch.Tensor | None, past_len: int
                            ) -> tuple[torch.Tensor, kernels.AttentionLayout]:
    """Under context parallelism (parallel/context_parallel/context_shard.py), from the whole
    sequence's position ids and key padding mask: this rank's share of the positions (RoPE
    rotates its tokens by their true positions) and the ring layout with its share of the
    sample ids (None: one unpadded sample per row, plain causal)."""
    if past_len:
        raise ValueError("context parallelism runs whole sequences, not a KV cache: generate "
                         "with the whole model")
    sample_ids = None if key_padding_mask is None else context.shard(key_padding_mask)
    return context.shard(position_ids), kernels.AttentionLayout("ring", context=context,
                                                                sample_ids=sample_ids)


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
