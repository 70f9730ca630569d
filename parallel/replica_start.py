"""Data-parallel replicas start identical: every rank of the group takes its first rank's
weights and buffers, whatever each rank's own initialisation was (a seed that differs per rank,
a checkpoint only one rank loaded). Our DDP and ZeRO-2/3's ShardedDataParallel both do this
before they lay out buckets or shards, as torch's DDP and FSDP do at construction.
"""

from __future__ import annotations

from itertools import chain

import torch
import torch.distributed as dist
from torch import nn


@torch.no_grad()
def broadcast_from_first_rank(module: nn.Module, process_group: dist.ProcessGroup | None) -> None:
    """Overwrite `module`'s parameters and buffers with those of the group's first rank (its
    global rank named to the collective); all broadcasts are in flight at once."""
    source = dist.get_global_rank(process_group, 0) if process_group else 0
    works = [dist.broadcast(tensor, src=source, group=process_group, async_op=True)
             for tensor in chain(module.parameters(), module.buffers())]
    for work in works:
        work.wait()
