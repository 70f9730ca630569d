"""Forward passes through a pipeline's stages (parallel/pipeline_parallel/schedules.py), for
the grid's training step, its evaluation and DPO's frozen reference (trainer/model_parallel.py):

    training          `pipelined_forward_backward`: the schedule (afab or 1f1b) in place of
                      the micro-batch loop
    evaluation        a forward-only pass through the stages (`PipelinedEval`)
    DPO               the frozen reference cut like the policy (`split_reference`; with
                      LoRA the policy's own stages, adapters off: `PipelinedBase`); each
                      micro-batch's reference log-probs come first (forward only through the
                      reference's stages), then the schedule runs the policy with DPO's
                      objective on the last stage, from vocab-parallel token log-probs
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from model.modeling_z2all import Z2allForCausalLM
from parallel.pipeline_parallel.schedules import PipelineSchedule
from parallel_plan.llama_pipeline import llama_stage, split_into_stage
from parallel_plan.llama_tensor_parallel import parallelize_model
from trainer.forward_steps import (
    DPOStep,
    ForwardStep,
    as_base_model,
    language_model_objective,
)
from trainer.global_batch import Batch


class PipelinedEval:
    """`model(input_ids, labels=..., attention_mask=...).loss` and `model.token_log_probs(...)`
    through the stages, forward only, the result on every rank: a `CausalLM`
    (trainer/forward_steps.py) for the evaluator and DPO's frozen reference."""

    def __init__(self, schedule: PipelineSchedule) -> None:
        self.schedule = schedule

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, labels: torch.Tensor,
                 attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        batch = {"input_ids": input_ids, "labels": labels}
        if attention_mask is not None:
            batch["attention_mask"] = attention_mask
        return SimpleNamespace(loss=self.schedule.forward_only(batch))

    def token_log_probs(self, input_ids: torch.Tensor, labels: torch.Tensor,
                        attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch = {"input_ids": input_ids, "labels": labels}
        if attention_mask is not None:
            batch["attention_mask"] = attention_mask
        return self.schedule.forward_only(batch, per_token=True)


class PipelinedBase(PipelinedEval):
    """LoRA DPO's reference on a grid: the policy's own stages as its frozen base (adapters
    off, eval mode), forward only; no second model, as in one process."""

    def token_log_probs(self, input_ids: torch.Tensor, labels: torch.Tensor,
                        attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        with as_base_model(self.schedule.model):
            return super().token_log_probs(input_ids, labels, attention_mask)


def split_reference(reference: Z2allForCausalLM, policy_schedule: PipelineSchedule
                    ) -> PipelinedEval:
    """DPO's frozen reference (whole, as loaded) cut exactly like the policy: the same stage
    and tensor slices on this rank, run forward-only through the same stages."""
    dims = policy_schedule.dims
    split_into_stage(reference, dims)
    if dims.tensor_parallel > 1:
        parallelize_model(reference, dims, policy_schedule.sequence_parallel)
    reference.requires_grad_(False)
    return PipelinedEval(PipelineSchedule(llama_stage(reference, dims), dims,
                                          policy_schedule.schedule,
                                          policy_schedule.sequence_parallel))


def pipelined_forward_backward(schedule: PipelineSchedule, forward_step: ForwardStep,
                               micro_batches: list[Batch]
                               ) -> tuple[torch.Tensor, dict[str, float]]:
    """The grid's stand-in for the micro-batch loop: (summed loss, summed task metrics), each
    micro-batch's share of the global batch's (trainer/global_batch.py). DPO first computes
    every micro-batch's reference log-probs (forward only through the reference's stages),
    then the schedule runs the policy with DPO's objective on the last stage, from
    vocab-parallel token log-probs (no gathered logits)."""
    if isinstance(forward_step, DPOStep):
        micro_batches = [forward_step.with_reference(schedule.model, batch)
                         for batch in micro_batches]
        loss = schedule.step(micro_batches, forward_step.objective, per_token=True)
    else:
        loss = schedule.step(micro_batches, language_model_objective)
    return loss, schedule.last_step_extras
