"""Checkpoints that do not depend on the grid: tensors saved whole, under the unsharded
model's parameter names, so a run on any other grid can load them.

Saving (`gather_full_tensors`, collective: every rank calls it), for any {name: local tensor}
of a stage (the model's state dict, or one optimizer state such as Adam's `exp_avg`):

    Step 1  tensor parallel: all-gather each split tensor over the TP group and reassemble it
            (sharding.unshard_tensors); replicated tensors (norms) are taken as they are.
    Step 2  pipeline parallel: the (dp 0, cp 0, tp 0) rank of every stage sends its full
            tensors to global rank 0 (gather over rank 0's pipeline group), which merges the
            stages. Data- and context-parallel replicas hold the same values and send nothing.

Loading (`shard_full_tensors`, no communication): each rank keeps the names its stage holds
and slices them with the same layouts. Worked example, a 2x2 grid (TP=2, PP=2) saving the
4-layer tiny model: rank 0 (stage 0, tp 0) holds `model.layers.0.self_attn.qkv_proj.weight`
rows [q0 q1 | k0 | v0]; step 1 rebuilds all of q0..q3 | k0 k1 | v0 v1 on ranks 0 and 1, step
2 brings layers 2-3 and the head from rank 2 to rank 0. A TP=2 run loading it keeps rows
[q0 q1 | k0 | v0] on its rank 0 again; a single process keeps everything.

The optimizer state uses the same functions on each state tensor, and is written in
optimizer/distributed_optimizer/zero1_checkpoint.py's format as one piece per parameter
covering elements [0, numel) (see the trainer wiring in docs/design.md).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel.parallel_dims import ParallelDims
from parallel.tensor_parallel.sharding import LayoutOf, shard_tensor, unshard_tensors


def gather_full_tensors(local: dict[str, torch.Tensor], layout_of: LayoutOf,
                        dims: ParallelDims) -> dict[str, torch.Tensor] | None:
    """The whole model's tensors on global rank 0 (module docstring), None elsewhere;
    `layout_of` says how the model splits each name under tensor parallelism."""
    # Step 1: undo tensor parallelism.
    full = {}
    for name, tensor in local.items():
        layout = layout_of(name) if dims.tensor_parallel > 1 else None
        if layout is None:
            full[name] = tensor.detach().clone()
            continue
        shards = [torch.empty_like(tensor) for _ in range(dims.tensor_parallel)]
        dist.all_gather(shards, tensor.detach().contiguous(), group=dims.tp_group)
        full[name] = unshard_tensors(shards, layout)
    # Step 2: merge the pipeline stages on global rank 0.
    if dims.pipeline_parallel == 1:
        return full if dims.rank == 0 else None
    if dims.dp_rank != 0 or dims.cp_rank != 0 or dims.tp_rank != 0:
        return None
    stages = [None] * dims.pipeline_parallel if dims.rank == 0 else None
    dist.gather_object(full, stages, dst=0, group=dims.pp_group)
    if dims.rank != 0:
        return None
    return {name: tensor for stage in stages for name, tensor in stage.items()}


def shard_full_tensors(full: dict[str, torch.Tensor], names: list[str], layout_of: LayoutOf,
                       dims: ParallelDims) -> dict[str, torch.Tensor]:
    """This rank's slices of the tensors `names` (its stage's) from a whole-model dict."""
    missing = sorted(set(names) - set(full))
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors this rank needs, e.g. "
                         f"{missing[0]} (saved for a different model?)")
    local = {}
    for name in names:
        layout = layout_of(name) if dims.tensor_parallel > 1 else None
        local[name] = (full[name] if layout is None
                       else shard_tensor(full[name], layout, dims.tp_rank, dims.tensor_parallel))
    return local
