"""The two flat-tensor collectives of sharded training, under whichever name this torch has.

A reduce-scatter sums equal-sized inputs across ranks and leaves rank r with the r-th slice of
the sum; an all-gather concatenates each rank's slice into one full tensor on every rank. Both
work on one flat buffer (no lists of tensors), which is what DDP buckets, ZeRO shards and tensor
parallel activations are. torch 2.13 renamed them (`reduce_scatter_tensor` ->
`reduce_scatter_single`, `all_gather_into_tensor` -> `all_gather_single`, the old names now
warn); CUDA builds of older torch, as GPU images ship them, have only the old names.
"""

from __future__ import annotations

import torch.distributed as dist

reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
