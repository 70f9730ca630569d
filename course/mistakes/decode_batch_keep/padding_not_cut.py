"""the left padding only the leaving rows needed is kept.

After rows leave, the slots on the left that no remaining row uses are padding for everyone: cut
them from the mask and the cache (first_used), or every later step attends over them.
"""

from __future__ import annotations

import torch


def keep(self, rows: list[int]) -> None:
    index = torch.tensor(rows, dtype=torch.long, device=self.key_padding_mask.device)
    for store in (self.kv_cache.keys, self.kv_cache.values):
        for layer, tensor in enumerate(store):
            store[layer] = tensor.index_select(0, index)
    self.key_padding_mask = self.key_padding_mask.index_select(0, index)
