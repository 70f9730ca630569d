"""each step's keys written from slot 0 instead of after the filled slots.

Slots 0..length-1 already hold earlier tokens: the new T tokens go to [length, length + T), and
the views returned end there.
"""

from __future__ import annotations

import torch


def append(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    end = self.length + key.shape[1]
    capacity = self.keys[layer_idx].shape[1]
    if end > capacity:
        self._grow(layer_idx, max(end, 2 * capacity))
    self.keys[layer_idx][:, :key.shape[1]] = key
    self.values[layer_idx][:, :key.shape[1]] = value
    return self.keys[layer_idx][:, :end], self.values[layer_idx][:, :end]
