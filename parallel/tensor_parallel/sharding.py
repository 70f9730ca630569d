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

A block that T does not divide is first zero-padded at its end to the next multiple of T
(Megatron-LM's padded vocabulary). Only a vocabulary is ever padded (the plan refuses head
counts and MLP widths that T does not divide): Llama-3's 128,256 tokens split by 3, or a
tokenizer's 301, are real vocabularies. Worked example, 5 embedding rows e0..e4 on T=2:
padded to e0 e1 e2 e3 e4 0, rank 0 keeps e0 e1 e2 (vocab_start 0) and rank 1 keeps e3 e4 0
(vocab_start 3). No id reaches the zero row, and the head masks its logit (layers.py), so it
gets no gradient and stays zero; `unshard_tensors` drops it again, so checkpoints and exports
hold the real 5 rows.

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


def padded_size(size: int, parts: int) -> int:
    """`size` rounded up to a multiple of `parts` (a block's length once padded)."""
    return -(-size // parts) * parts


def _zero_padded(block: torch.Tensor, dim: int, parts: int) -> torch.Tensor:
    """`block` with zeros appended along `dim` up to a multiple of `parts`."""
    missing = padded_size(block.shape[dim], parts) - block.shape[dim]
    if missing == 0:
        return block
    shape = list(block.shape)
    shape[dim] = missing
    return torch.cat([block, block.new_zeros(shape)], dim=dim)


def shard_tensor(full: torch.Tensor, layout: ShardLayout, rank: int, size: int
                 ) -> torch.Tensor:
    """Rank `rank`'s slice: chunk `rank` of every (zero-padded) block, concatenated."""
    blocks = full.split(layout.blocks, dim=layout.dim)
    return torch.cat([_zero_padded(block, layout.dim, size).chunk(size, dim=layout.dim)[rank]
                      for block in blocks], dim=layout.dim).contiguous()


def unshard_tensors(shards: list[torch.Tensor], layout: ShardLayout) -> torch.Tensor:
    """The full tensor from every rank's slice (in rank order), padding dropped."""
    size = len(shards)
    local_blocks = [padded_size(block, size) // size for block in layout.blocks]
    per_rank = [shard.split(local_blocks, dim=layout.dim) for shard in shards]
    return torch.cat([torch.cat([per_rank[rank][index] for rank in range(size)],
                                dim=layout.dim).narrow(layout.dim, 0, block)
                      for index, block in enumerate(layout.blocks)], dim=layout.dim)
