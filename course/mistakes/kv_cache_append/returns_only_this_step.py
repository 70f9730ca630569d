"""only this step's keys and values returned.

Attention at step t needs the keys and values of every token so far: return the views [:, :end],
not the new [:, length:end].
"""

from __future__ import annotations

import torch


def append(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    end = self.length + key.shape[1]
    capacity = self.keys[layer_idx].shape[1]
    if end > capacity:
        self._grow(layer_idx, max(end, 2 * capacity))
    self.keys[layer_idx][:, self.length:end] = key
    self.values[layer_idx][:, self.length:end] = value
    return key, value
