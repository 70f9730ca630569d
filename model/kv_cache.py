"""Key/value cache for incremental decoding.

Generating token t+1 needs the keys and values of tokens 0..t at every layer. Recomputing them
each step costs O(t) per step (O(n^2) per sequence); caching them costs memory
2 * layers * batch * kv_heads * head_dim numbers per token, which GQA/MQA shrink.

Layout per layer: keys/values [batch, capacity, kv_heads, head_dim]; slots 0..length-1 are
filled. All rows share `length`, because prompts of different lengths are left-padded:

    row 0:  pad pad  A   B   C  | new tokens ...
    row 1:   D   E   F   G   H  | new tokens ...

When a step would overflow, the capacity doubles (one copy, amortised O(1) per token).
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, batch_size: int, capacity: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (batch_size, capacity, num_kv_heads, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.length = 0

    def append(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's [B, T, KV, D] keys/values after the filled slots of `layer_idx`
        and return all keys/values so far (views). Call `advance(T)` after the last layer."""
        end = self.length + key.shape[1]
        capacity = self.keys[layer_idx].shape[1]
        if end > capacity:
            self._grow(layer_idx, max(end, 2 * capacity))
        self.keys[layer_idx][:, self.length:end] = key
        self.values[layer_idx][:, self.length:end] = value
        return self.keys[layer_idx][:, :end], self.values[layer_idx][:, :end]

    def advance(self, num_tokens: int) -> None:
        self.length += num_tokens

    def _grow(self, layer_idx: int, new_capacity: int) -> None:
        for store in (self.keys, self.values):
            old = store[layer_idx]
            store[layer_idx] = old.new_empty((old.shape[0], new_capacity, *old.shape[2:]))
            store[layer_idx][:, :self.length] = old[:, :self.length]
