"""The communication of tensor parallelism, as autograd functions with their backward written out.

Megatron-LM (Shoeybi et al. 2019) splits each block's two matmuls so a block needs one
collective forward and one backward. In the tensor-parallel group of T ranks, per block:

    x (same on all ranks) --copy--> [column-parallel A_r] --> [row-parallel B_r] --reduce--> y
                           f: fwd identity                          g: fwd all-reduce
                              bwd all-reduce                           bwd identity

`copy` and `reduce` are conjugates: where one communicates forward, the other communicates
backward. With sequence parallelism (Korthikanti et al. 2022) the activations between blocks
(norms, residuals) are split along the sequence, and the pair becomes

    x_r (my tokens) --all-gather(seq)--> [A_r] --> [B_r] --reduce-scatter(seq)--> y_r
                     bwd reduce-scatter                    bwd all-gather

the same bytes as one all-reduce (an all-reduce *is* a reduce-scatter then an all-gather), but
norms and dropout now run on 1/T of the tokens. `gather` / `scatter` along the last dimension
are the other conjugate pair (full logits for generation). Activations are [batch, seq, ...];
the sequence dimension is 1.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel.flat_collectives import all_gather_single, reduce_scatter_single

SEQUENCE_DIM = 1


def _all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    tensor = tensor.contiguous().clone()
    dist.all_reduce(tensor, group=group)
    return tensor


def _all_gather(tensor: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Concatenate the ranks' tensors along `dim` (rank order)."""
    size = dist.get_world_size(group)
    moved = tensor.movedim(dim, 0).contiguous()
    output = moved.new_empty((size * moved.shape[0], *moved.shape[1:]))
    all_gather_single(output, moved, group=group)
    return output.movedim(0, dim)


def _reduce_scatter(tensor: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Sum over ranks, then keep this rank's 1/T slice along `dim`."""
    size = dist.get_world_size(group)
    moved = tensor.movedim(dim, 0).contiguous()
    output = moved.new_empty((moved.shape[0] // size, *moved.shape[1:]))
    reduce_scatter_single(output, moved, group=group)
    return output.movedim(0, dim)


def _split(tensor: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """This rank's 1/T slice along `dim` (no communication)."""
    chunks = tensor.chunk(dist.get_world_size(group), dim=dim)
    return chunks[dist.get_rank(group)].contiguous()


class _CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        # Every rank used x for its own slice of outputs: x's gradient is the sum.
        return _all_reduce(grad, ctx.group), None


class _ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        return _all_reduce(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        # y = sum_r y_r: each partial sum gets y's gradient unchanged.
        return grad, None


class _GatherFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _all_gather(tensor, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, -1, ctx.group), None


class _ScatterToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _split(tensor, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, -1, ctx.group), None


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _all_gather(tensor, SEQUENCE_DIM, group)

    @staticmethod
    def backward(ctx, grad):
        # Each rank's gradient of the full sequence is partial (its slice of the outputs):
        # sum them, and each rank keeps its own tokens.
        return _reduce_scatter(grad, SEQUENCE_DIM, ctx.group), None


class _ReduceScatterSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _reduce_scatter(tensor, SEQUENCE_DIM, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, SEQUENCE_DIM, ctx.group), None


def copy_to_region(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Forward identity, backward all-reduce (`f` in Megatron's paper)."""
    return _CopyToRegion.apply(tensor, group)


def reduce_from_region(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Forward all-reduce, backward identity (`g` in Megatron's paper)."""
    return _ReduceFromRegion.apply(tensor, group)


def gather_from_region(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Forward all-gather along the last dim, backward keep my slice."""
    return _GatherFromRegion.apply(tensor, group)


def scatter_to_region(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Forward keep my slice of the last dim, backward all-gather."""
    return _ScatterToRegion.apply(tensor, group)


def gather_sequence(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Sequence parallel: forward all-gather the tokens, backward reduce-scatter."""
    return _GatherSequence.apply(tensor, group)


def reduce_scatter_sequence(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Sequence parallel: forward reduce-scatter the tokens, backward all-gather."""
    return _ReduceScatterSequence.apply(tensor, group)
