"""A pipeline stage as the schedule sees it: a module holding some consecutive part of a model,
and how to run it. The schedule (schedules.py) knows nothing of which model it drives: the
model's plan cuts the model and hands over a `PipelineStage` (for our llama,
parallel_plan/llama_pipeline.py).

    stage 0:  forward(None, micro_batch)         -> hidden [B, S, H]  --send-->
    stage 1:  forward(hidden, micro_batch)       -> hidden [B, S, H]  --send-->
    ...
    stage P-1: forward(hidden, micro_batch)      -> the micro-batch's mean loss
               forward(hidden, micro_batch, per_token=True) -> token log-probs [B, S]

Every stage sees the whole micro-batch (its `input_ids` and `attention_mask` give positions and
masks); only the last one reads the labels.

A weight shared by two stages (a tied embedding: the first stage's embedding and the last
stage's head are one Parameter in the whole model, two copies here, equal at the start) must
move identically: `sync_shared_grads` sums the two copies' gradients over the group that links
those two ranks (`ParallelDims.embedding_group`, Megatron-LM's "embedding group"), so the
optimizer sees the same gradient on both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from parallel.gradient_sync import GradientSync

# (the previous stage's output or None on the first stage, the micro-batch, per_token)
#   -> the next stage's input, or on the last stage the loss (per_token: token log-probs)
StageForward = Callable[[torch.Tensor | None, dict[str, torch.Tensor], bool], torch.Tensor]


@dataclass
class PipelineStage:
    """One rank's stage, as the model's plan hands it to the schedule (module docstring)."""

    module: nn.Module
    """This stage's part of the model (its parameters are what this rank trains)."""
    forward: StageForward
    hidden_size: int
    """The width of what stages send each other: [B, S, H], S cut by C (context parallelism)
    and by T (sequence parallelism)."""
    shared_param: nn.Parameter | None = None
    """This stage's copy of a weight another stage also holds (module docstring), or None."""


def sync_shared_grads(stage: PipelineStage, group: dist.ProcessGroup | None,
                      grad_sync: GradientSync | None = None) -> None:
    """Sum the shared weight's two copies' gradients over `group`, as if they were one
    Parameter: the ones the optimizer reads, `grad_sync.accumulated_grad` with a data-parallel
    wrapper (DDP's `main_grad`, ZeRO-2/3's shard of the same elements on both stages), else
    `.grad`. A frozen one (LoRA's base) has none."""
    param = stage.shared_param
    if param is None or not param.requires_grad:
        return
    grad = param.grad if grad_sync is None else grad_sync.accumulated_grad(param)
    dist.all_reduce(grad, group=group)
