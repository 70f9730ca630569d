"""LoRA under tensor parallelism: each adapter sliced like its frozen base weight.

A `LoraLinear` (model/lora.py) computes y = W x + s B A x per row slice, s = alpha / r. With its
base split over the T ranks of the tensor-parallel group (parallel/tensor_parallel/layers.py),
rank r keeps:

    base                  W              A [r, in]     B [out, r]   y on rank r
    column-parallel       rows r         whole         rows r       W_r x + s B_r (A x)
      (q/k/v, gate/up)
    row-parallel          columns r      columns r     whole        sum over ranks of
      (o, down)                                                     W_r x_r + s B (A_r x_r)

so B A is exactly rank r's slice of the update (llama_tensor_parallel.py names these layouts, and
checkpoints gather the adapters whole with them). Column-parallel: rank r's output rows are its
own, no reduction, as for the base. Row-parallel: B (A_r x_r) is a partial sum like W_r x_r;
since B is linear the two partials are added first and reduced together, in the base's one
all-reduce (or reduce-scatter with sequence parallelism).

The replicated factor's gradient. Rank r's output rows depend on the whole A (column-parallel)
only through its rows B_r, and the reduced output on the whole B (row-parallel) through each
rank's partial A_r x_r: each rank computes a partial gradient of that factor, and the true one
is their sum. So the forward reads that factor through `copy_to_region` (identity forward,
all-reduce backward), as SequenceParallelNorm reads its replicated weight: every rank then
holds the same, whole gradient, and the optimizer's clipping counts the replicated factor once
(1/T per rank, trainer/model_parallel.py). The input's gradient needs nothing new: the
column-parallel layer's input already goes through `copy_to_region` (or the sequence gather),
whose backward sums the ranks' partial input gradients, the LoRA path's included.

Merging (W += s B A) works on the slices unchanged: B_r A and B A_r are this rank's slice of
B A. Dropout on the adapters' input is refused with tensor parallelism (as the model's own
dropout is, llama_shapes.py): the column-parallel layer's input is replicated, and each rank
would draw another mask for it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from model.lora import LoraLinear, linear_with_weight
from parallel.tensor_parallel.collectives import (
    copy_to_region,
    reduce_from_region,
    reduce_scatter_sequence,
)

# (the adapter's or weight's name within its layer, e.g. "lora_A.q_proj", the whole tensor)
#   -> this rank's slice (llama_tensor_parallel.py's layout; the tensor itself where it is
#   replicated)
LocalSlice = Callable[[str, torch.Tensor], torch.Tensor]


class _TensorParallelLoraLinear(LoraLinear):
    """A LoraLinear holding this rank's slices of a whole one (module docstring)."""

    def __init__(self, whole: LoraLinear, local_slice: LocalSlice, group: dist.ProcessGroup,
                 sequence_parallel: bool) -> None:
        adapters = {name: (local_slice(f"lora_A.{name}", whole.lora_A[name].detach()),
                           local_slice(f"lora_B.{name}", whole.lora_B[name].detach()))
                    for name in whole.lora_A}
        local_weight = torch.nn.Parameter(local_slice("weight", whole.weight.detach()))
        # Output rows per row slice: each slice's rows split T ways where the rows are split.
        split = whole.weight.shape[0] // local_weight.shape[0]
        row_slices = [(name, rows // split) for name, rows in whole.row_slices]
        super().__init__(linear_with_weight(local_weight), row_slices, whole.config, adapters)
        self.group = group
        self.sequence_parallel = sequence_parallel


class ColumnParallelLoraLinear(_TensorParallelLoraLinear):
    """The base split by output rows: W_r x + s B_r (A x) per row slice; A's gradient summed."""

    def adapter_weights(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        return copy_to_region(self.lora_A[name], self.group), self.lora_B[name]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.sequence_parallel:  # (gathered, with a reduce-scatter backward, otherwise)
            x = copy_to_region(x, self.group)
        return super().forward(x)


class RowParallelLoraLinear(_TensorParallelLoraLinear):
    """The base split by input columns: the partial W_r x_r + s B (A_r x_r), reduced once;
    B's gradient summed."""

    def adapter_weights(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lora_A[name], copy_to_region(self.lora_B[name], self.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = super().forward(x)
        if self.sequence_parallel:
            return reduce_scatter_sequence(partial, self.group)
        return reduce_from_region(partial, self.group)
