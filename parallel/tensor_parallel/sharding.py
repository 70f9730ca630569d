"""How a tensor-parallel weight is split, and the slicing both ways.

A `ShardLayout` says along which dimension a weight is split and into which fused blocks.
Each block is split into T equal chunks and rank r keeps chunk r of every block, so a fused
matrix stays fused on every rank. Worked example, a fused `qkv_proj.weight` with 4 query heads
and 2 key/value heads of size d (rows: q0 q1 q2 q3 | k0 k1 | v0 v1), T=2:

    blocks (4d, 2d, 2d) along dim 0
    rank 0 keeps  q0 q1 | k0 | v0        (its 2 query heads and the key/value head they use)
    rank 1 keeps  q2 q3 | k1 | v1

so each rank runs ordinary attention on its heads. Which weight of a model has which layout
is the model's plan's knowledge, not this package's: it passes a `LayoutOf` (for our llama,
parallel_plan/llama_tensor_parallel.py).

`shard_tensor` and `unshard_tensors` are exact inverses; checkpoints use them to save the
unsharded model whatever the grid (parallel/layout_neutral_checkpoint.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ShardLayout:
    dim: int
    """The dimension that is split."""
    blocks: tuple[int, ...]
    """Sizes along `dim` of the fused blocks of the unsharded weight; each is split in T."""


# A model's answer to "how is the unsharded parameter `name` split?" (None: replicated). The
# model's plan supplies it (parallel_plan/llama_tensor_parallel.py `layout_for`): this package
# knows how to slice, not which weights of which model.
LayoutOf = Callable[[str], ShardLayout | None]


def shard_tensor(full: torch.Tensor, layout: ShardLayout, rank: int, size: int
                 ) -> torch.Tensor:
    """Rank `rank`'s slice: chunk `rank` of every block, concatenated."""
    blocks = full.split(layout.blocks, dim=layout.dim)
    return torch.cat([block.chunk(size, dim=layout.dim)[rank] for block in blocks],
                     dim=layout.dim).contiguous()


def unshard_tensors(shards: list[torch.Tensor], layout: ShardLayout) -> torch.Tensor:
    """The full tensor from every rank's slice (in rank order)."""
    size = len(shards)
    local_blocks = [block // size for block in layout.blocks]
    per_rank = [shard.split(local_blocks, dim=layout.dim) for shard in shards]
    return torch.cat([per_rank[rank][block] for block in range(len(layout.blocks))
                      for rank in range(size)], dim=layout.dim)
