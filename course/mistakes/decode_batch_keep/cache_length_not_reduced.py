"""the cache's length not reduced by the slots cut away.

The cache's `length` counts its filled slots; cutting `first_used` slots from the left must
lower it by as many, or the next token is written after a gap.
"""

from __future__ import annotations

import torch


def keep(self, rows: list[int]) -> None:
    index = torch.tensor(rows, dtype=torch.long, device=self.key_padding_mask.device)
    mask = self.key_padding_mask.index_select(0, index)
    first_used = int(mask.any(dim=0).long().argmax()) if rows else 0
    for store in (self.kv_cache.keys, self.kv_cache.values):
        for layer, tensor in enumerate(store):
            store[layer] = tensor.index_select(0, index)[:, first_used:]
    self.key_padding_mask = mask[:, first_used:]
