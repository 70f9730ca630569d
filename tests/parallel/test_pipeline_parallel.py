"""Our 1F1B schedule against torch.distributed.pipelining.Schedule1F1B on 2 gloo ranks: the
same two stages of the tiny model, the same micro-batches; losses and every gradient agree."""

from __future__ import annotations

import copy

import torch
from torch import nn

from parallel.local_ranks import run_on_ranks
from parallel.parallel_dims import ParallelDims
from parallel.pipeline_parallel.schedules import PipelineSchedule
from parallel_plan.llama_pipeline import llama_stage, split_into_stage
from tests.model.model_helpers import small_model
from tests.parallel.grid_helpers import micro_batches_of

NUM_MICRO = 4


class _TorchStage(nn.Module):
    """One of our stages as torch's pipelining wants it: a tensor in, a tensor out (the last
    stage returns the normed hidden states; the loss function applies the head)."""

    def __init__(self, model, is_first: bool) -> None:
        super().__init__()
        self.model, self.is_first = model, is_first

    def forward(self, stage_input: torch.Tensor) -> torch.Tensor:
        inner = self.model.model
        hidden = inner.embed_tokens(stage_input) if self.is_first else stage_input
        hidden = inner.run_blocks(hidden, inner.block_inputs(None, hidden.shape[1], 0, hidden))
        return hidden if self.is_first else inner.norm(hidden)


def _ours_equals_torch_1f1b(rank: int, world_size: int) -> dict:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    dims = ParallelDims(world_size, pipeline_parallel=world_size).build_groups()
    ours = split_into_stage(small_model("gqa", seed=0, tie_word_embeddings=False), dims)
    theirs = copy.deepcopy(ours)
    micro_batches = [{"input_ids": mb["input_ids"], "labels": mb["labels"]}
                     for mb in micro_batches_of(step=0, data_parallel=1, num_micro=NUM_MICRO)[0]]
    our_loss = PipelineSchedule(llama_stage(ours, dims), dims, "1f1b").step(micro_batches)

    stage = PipelineStage(_TorchStage(theirs, dims.is_first_stage), dims.pp_rank, world_size,
                          torch.device("cpu"))
    schedule = Schedule1F1B(stage, NUM_MICRO, loss_fn=theirs.head_loss)
    input_ids = torch.cat([mb["input_ids"] for mb in micro_batches])
    labels = torch.cat([mb["labels"] for mb in micro_batches])
    losses: list[torch.Tensor] = []
    if dims.is_first_stage:
        schedule.step(input_ids)
    else:
        schedule.step(target=labels, losses=losses)
        torch.testing.assert_close(our_loss, torch.stack(losses).mean())
    their_params = dict(theirs.named_parameters())
    for name, param in ours.named_parameters():
        torch.testing.assert_close(param.grad, their_params[name].grad, msg=name)
    return len(their_params)


def test_our_1f1b_equals_torch_schedule_1f1b():
    checked = run_on_ranks(_ours_equals_torch_1f1b, world_size=2, timeout=600)
    assert all(count > 0 for count in checked)
