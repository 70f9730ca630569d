"""`ContextShard`: what a model needs to compute on this rank's share of every sequence.

The model keeps taking whole [B, S] inputs (token ids, labels, the padding mask) on every rank
of the context-parallel group, and the batch is the same on all of them. Each rank computes
only its S/C tokens, chunks i and 2C-1-i (`shard`, load_balance.py), through four steps:

    Step 1  embed its own tokens                                  `shard(input_ids)`
    Step 2  positions and sample ids of the *whole* sequence      `shard(position_ids)`
            (a packed sample may start in another rank's chunk),   `shard(key_padding_mask)`
            then its share of them: RoPE at the true positions
    Step 3  attention to every key around the group's ring         `attention` (ring_attention.py)
    Step 4  its share of the loss made the whole sequence's,      `mean_over_ranks`: all-reduce
            the same on every rank                                 `gather` (token log-probs)

Step 4's gradients. Every rank of the group ends with a copy of the same loss L, and each
copy's backward reaches only the tokens held on its own rank. The backward of a collective
is its adjoint with every copy counted: an all-reduce's is an all-reduce, an all-gather's a
reduce-scatter (here an all-reduce, then this rank's chunks). So rank c gets C times its
partial gradient g_c (one g_c from each of the C copies), and DDP, which averages over the
D x C ranks of the dp x cp group, divides the copies back out:

    (1 / DC) sum_d sum_c C g_dc  =  (1 / D) sum_d dL_d/dtheta

the data-parallel average of whole-sequence gradients. (Megatron-LM multiplies its loss by
the context-parallel size for the same reason.) Worked example, C = 2, one sequence whose 8
targets split 3 + 5: rank 0's mean m0 over its 3, rank 1's m1 over its 5; both ranks get
L = (3 m0 + 5 m1) / 8; rank 0's gradient is 2 x 3/8 dm0, rank 1's 2 x 5/8 dm1, and DDP's
average over the two is 3/8 dm0 + 5/8 dm1 = dL.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from parallel.context_parallel.load_balance import (
    SEQUENCE_DIM,
    gather_sequence,
    shard_sequence,
)
from parallel.context_parallel.ring_attention import ring_attention


class _SumOverGroup(torch.autograd.Function):
    """All-reduce (sum); backward: the all-reduce of every rank's incoming gradient."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        summed = tensor.clone()
        dist.all_reduce(summed, group=group)
        return summed

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        summed = grad.clone()
        dist.all_reduce(summed, group=ctx.group)
        return summed, None


class _GatherSequence(torch.autograd.Function):
    """Every rank's shard, in sequence order, on every rank; backward: the gradients of all
    copies summed (all-reduce), then this rank's chunks of the sum."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return gather_sequence(shard, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        summed = grad.contiguous().clone()
        dist.all_reduce(summed, group=ctx.group)
        return (shard_sequence(summed, dist.get_rank(ctx.group), dist.get_world_size(ctx.group)),
                None)


@dataclass(frozen=True)
class ContextShard:
    """This rank's place in its context-parallel group (module docstring). Tensors are indexed
    [row, token, ...]: the sequence is dimension 1."""

    group: dist.ProcessGroup
    rank: int
    size: int

    @classmethod
    def of(cls, group: dist.ProcessGroup) -> ContextShard:
        return cls(group, dist.get_rank(group), dist.get_world_size(group))

    def shard(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's two chunks of a whole-sequence tensor [B, S, ...] (no communication)."""
        return shard_sequence(tensor, self.rank, self.size, SEQUENCE_DIM)

    def attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  sample_ids: torch.Tensor | None) -> torch.Tensor:
        """Step 3: causal attention of this rank's queries on the whole sequence's keys
        (ring_attention.py; `sample_ids`: this rank's share of the key padding mask)."""
        return ring_attention(query, key, value, self.group, sample_ids=sample_ids)

    def mean_over_ranks(self, local_mean: torch.Tensor, local_count: torch.Tensor
                        ) -> torch.Tensor:
        """Step 4 for a mean loss: sum_c mean_c n_c / sum_c n_c over the group, from this
        rank's mean over its `local_count` tokens; 0 when no rank has one (as the model's own
        mean is). Differentiable (module docstring)."""
        total = local_count.detach().float().clone()
        dist.all_reduce(total, group=self.group)
        return _SumOverGroup.apply(local_mean * local_count, self.group) / total.clamp(min=1)

    def gather(self, shard: torch.Tensor) -> torch.Tensor:
        """Step 4 for per-token values: [B, S/C, ...] -> the whole [B, S, ...] in sequence order
        on every rank. Differentiable (module docstring)."""
        return _GatherSequence.apply(shard, self.group)
