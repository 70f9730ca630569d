"""The tensor-parallel modules: each holds only this rank's slice of its weight.

    ColumnParallelLinear   y_r = x A_r        (A split by output rows: q/k/v, gate/up)
    RowParallelLinear      y = sum_r x_r B_r  (B split by input columns: o, down)
    VocabParallelEmbedding rank r looks up ids in [r V'/T, (r+1) V'/T), others give 0, sum
    VocabParallelLMHead    logits for this rank's vocabulary slice, and the loss from them
    SequenceParallelNorm   the norm on my 1/T of the tokens, output gathered

V' is the vocabulary V padded to a multiple of T (sharding.py): the padding rows are never
looked up, and the head masks their logits to -inf, so no padded token is ever predicted,
weighs in a softmax or gets a gradient.

Column then row needs no communication in between (each rank's column slice is exactly the
input its row slice needs); the row-parallel output is partial and summed across ranks (or,
with sequence parallelism, summed and scattered by token). See collectives.py for the pairs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parallel.tensor_parallel.collectives import (
    copy_to_region,
    gather_from_region,
    gather_sequence,
    reduce_from_region,
    reduce_scatter_sequence,
)
from parallel.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
from utils.labels import IGNORE_INDEX


class ColumnParallelLinear(nn.Module):
    """y_r = x @ weight_r^T. With sequence parallelism the input arrives already gathered by
    the preceding SequenceParallelNorm (whose backward reduce-scatters x's gradient);
    without it, `copy_to_region` all-reduces x's gradient in backward."""

    def __init__(self, local_weight: torch.Tensor, group: dist.ProcessGroup,
                 sequence_parallel: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(local_weight)
        self.group = group
        self.sequence_parallel = sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.sequence_parallel:
            x = copy_to_region(x, self.group)
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    """y = sum over ranks of x_r @ weight_r^T: all-reduce, or reduce-scatter over tokens."""

    def __init__(self, local_weight: torch.Tensor, group: dist.ProcessGroup,
                 sequence_parallel: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(local_weight)
        self.group = group
        self.sequence_parallel = sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight)
        if self.sequence_parallel:
            return reduce_scatter_sequence(partial, self.group)
        return reduce_from_region(partial, self.group)


class VocabParallelEmbedding(nn.Module):
    """Rank r holds rows [vocab_start, vocab_start + V'/T) of the (padded) table."""

    def __init__(self, local_weight: torch.Tensor, vocab_start: int,
                 group: dist.ProcessGroup, sequence_parallel: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(local_weight)
        self.vocab_start = vocab_start
        self.group = group
        self.sequence_parallel = sequence_parallel

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local_ids = input_ids - self.vocab_start
        elsewhere = (local_ids < 0) | (local_ids >= self.weight.shape[0])
        rows = F.embedding(local_ids.masked_fill(elsewhere, 0), self.weight)
        partial = rows.masked_fill(elsewhere[..., None], 0.0)  # exactly one rank has each id
        if self.sequence_parallel:
            return reduce_scatter_sequence(partial, self.group)
        return reduce_from_region(partial, self.group)


class VocabParallelLMHead(nn.Module):
    """The output layer with the same call forms as model/chunked_lm_head.py's `LMHead`:
    forward(hidden) gives full logits (gathered: generation), forward(hidden, labels) the mean
    loss, forward(hidden, labels, per_token=True) per-token log-probs; the loss paths never
    gather the full logits (cross_entropy.py). `vocab_size` is the real vocabulary: rows of
    this slice at or past it are padding, their logits -inf (module docstring)."""

    def __init__(self, local_weight: torch.Tensor, vocab_start: int,
                 group: dist.ProcessGroup, sequence_parallel: bool, vocab_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(local_weight)
        self.vocab_start = vocab_start
        self.group = group
        self.sequence_parallel = sequence_parallel
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor | None = None,
                per_token: bool = False) -> torch.Tensor:
        if not self.sequence_parallel:
            hidden = copy_to_region(hidden, self.group)
        local_logits = F.linear(hidden, self.weight)
        real_rows = self.vocab_size - self.vocab_start
        if real_rows < local_logits.shape[-1]:  # this slice ends in padding
            padding = torch.arange(local_logits.shape[-1], device=local_logits.device)
            local_logits = local_logits.masked_fill(padding >= real_rows, float("-inf"))
        if labels is None:
            return gather_from_region(local_logits, self.group)[..., :self.vocab_size]
        token_losses = vocab_parallel_cross_entropy(local_logits, labels, self.vocab_start,
                                                    self.group)
        if per_token:
            return -token_losses
        num_valid = (labels != IGNORE_INDEX).sum().clamp(min=1)  # all ignored: 0, not NaN
        return token_losses.sum() / num_valid


# A norm's function, (x, weight, eps) -> normed x: the model's own kernel (for our llama,
# model/kernels.py's RMSNorm), so the sequence-parallel norm computes what the model's does.
NormFunction = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


class SequenceParallelNorm(nn.Module):
    """A norm on this rank's tokens [B, S/T, H], output gathered to [B, S, H] for the
    column-parallel matmul that follows. The weight is replicated but each rank sees only its
    tokens, so its gradient is partial: `copy_to_region` sums it over the group in backward."""

    def __init__(self, weight: torch.Tensor, eps: float, group: dist.ProcessGroup,
                 norm: NormFunction) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.eps = eps
        self.group = group
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = self.norm(x, copy_to_region(self.weight, self.group), self.eps)
        return gather_sequence(normed, self.group)
