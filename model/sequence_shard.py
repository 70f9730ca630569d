"""What the model needs from context parallelism, and nothing more: a `Protocol`.

Under context parallelism every rank holds a share of each sequence (two chunks of 2C, for
causal load balance). The model stays whole-sequence code: it asks a `SequenceShard` for its
share of a whole-sequence tensor, for attention over the whole sequence, and for a loss or
per-token values over all of it. `parallel/context_parallel/context_shard.py`'s `ContextShard`
is the implementation (ring attention over the group); the model never imports it, so `model/`
stays below `parallel/` (tests/test_layers.py), as it does for tensor and pipeline
parallelism, which cut the model from outside.
"""

from __future__ import annotations

from typing import Protocol

import torch


class SequenceShard(Protocol):
    """This rank's share of every sequence. Tensors are indexed [row, token, ...]."""

    def shard(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of a whole-sequence tensor [B, S, ...] (no communication)."""
        ...

    def attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  sample_ids: torch.Tensor | None) -> torch.Tensor:
        """Causal attention of this rank's queries on the keys of the whole sequence."""
        ...

    def mean_over_ranks(self, local_mean: torch.Tensor, local_count: torch.Tensor
                        ) -> torch.Tensor:
        """The mean over every rank's tokens, from this rank's mean over `local_count`."""
        ...

    def gather(self, shard: torch.Tensor) -> torch.Tensor:
        """Per-token values [B, S/C, ...] -> the whole [B, S, ...] on every rank."""
        ...
