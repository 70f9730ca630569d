"""The running batch of continuous batching: many requests' sequences in one KV cache.

Rows are sequences of different lengths, left-padded so that they all end at the same slot
(the layout of `model/kv_cache.py`). Worked example, 5 slots, `key_padding_mask`:

    row 0:  1 1 1 1 1      A B C D E    request 0: prompt A B C, generated D E
    row 1:  0 0 1 1 1      _ _ F G H    request 1 joined later: prompt F G, generated H

**Join.** Newcomers are prefilled together as their own small batch (own cache, length L').
To join a running batch of length L, the shorter side is left-padded to max(L, L') and the rows
are concatenated. Row 2 with a 4-token prompt W X Y Z joins the batch above:

    row 0:  1 1 1 1 1      A B C D E
    row 1:  0 0 1 1 1      _ _ F G H
    row 2:  0 1 1 1 1      _ W X Y Z

**Leave.** Finished rows are dropped, and slots that are padding in every remaining row are
cut from the left (row 0 finishing above leaves [_ F G H] and [W X Y Z], 4 slots).

Padding slots hold zeros and are masked out of attention; positions count real tokens only
(`model.attention.position_ids_for`); keys were rotated (RoPE) with their true positions when
they were cached. So moving a row's slots to the right changes nothing it computes: every row
decodes what it would decode alone, up to floating-point rounding.
"""

from __future__ import annotations

import torch

from model.kv_cache import KVCache
from model.modeling_z2all import Z2allForCausalLM


def _placed(filled: torch.Tensor, length: int, capacity: int) -> torch.Tensor:
    """[B, n, ...] -> [B, capacity, ...] holding `filled` in slots length-n .. length-1."""
    out = filled.new_zeros((filled.shape[0], capacity, *filled.shape[2:]))
    out[:, length - filled.shape[1]:length] = filled
    return out


class DecodeBatch:
    """A KV cache of B rows plus its [B, length] padding mask (1 = real token).

    The cache holds every token of a row except the newest one, which the next `decode`
    call feeds in."""

    def __init__(self, kv_cache: KVCache, key_padding_mask: torch.Tensor) -> None:
        self.kv_cache = kv_cache
        self.key_padding_mask = key_padding_mask
        assert kv_cache.length == key_padding_mask.shape[1]

    @classmethod
    def prefill(cls, model: Z2allForCausalLM, prompts: list[list[int]]
                ) -> tuple[DecodeBatch, torch.Tensor]:
        """Run the left-padded prompts through the model in one forward: (the batch holding
        their keys/values, fp32 next-token logits [B, V])."""
        width = max(len(prompt) for prompt in prompts)
        device = model.lm_head.weight.device
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                            device=device)
        kv_cache = model.new_kv_cache(len(prompts), 2 * width)
        logits = model.next_token_logits(ids, mask, kv_cache)
        return cls(kv_cache, mask), logits

    @property
    def size(self) -> int:
        return self.key_padding_mask.shape[0]

    @property
    def length(self) -> int:
        return self.kv_cache.length

    def decode(self, model: Z2allForCausalLM, newest_tokens: torch.Tensor) -> torch.Tensor:
        """Feed each row's newest token [B]; fp32 logits [B, V] for the token after it."""
        self.key_padding_mask = torch.cat(
            [self.key_padding_mask, self.key_padding_mask.new_ones(self.size, 1)], dim=1)
        return model.next_token_logits(newest_tokens[:, None], self.key_padding_mask,
                                       self.kv_cache)

    def join(self, other: DecodeBatch) -> None:
        """Append `other`'s rows after ours (see "Join" in the module docstring)."""
        length = max(self.length, other.length)
        capacity = 2 * length  # room to decode a while before the cache has to grow
        for ours, theirs in ((self.kv_cache.keys, other.kv_cache.keys),
                             (self.kv_cache.values, other.kv_cache.values)):
            for layer, (mine, new) in enumerate(zip(ours, theirs)):
                ours[layer] = torch.cat(
                    [_placed(mine[:, :self.length], length, capacity),
                     _placed(new[:, :other.length], length, capacity)], dim=0)
        self.key_padding_mask = torch.cat(
            [_placed(self.key_padding_mask, length, length),
             _placed(other.key_padding_mask, length, length)], dim=0)
        self.kv_cache.length = length

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows (in this order), then cut the all-padding slots on the left."""
        index = torch.tensor(rows, dtype=torch.long, device=self.key_padding_mask.device)
        mask = self.key_padding_mask.index_select(0, index)
        first_used = int(mask.any(dim=0).long().argmax()) if rows else 0
        for store in (self.kv_cache.keys, self.kv_cache.values):
            for layer, tensor in enumerate(store):
                store[layer] = tensor.index_select(0, index)[:, first_used:]
        self.key_padding_mask = mask[:, first_used:]
        self.kv_cache.length -= first_used
