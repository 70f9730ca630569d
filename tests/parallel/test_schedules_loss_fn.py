"""A task loss on the pipeline's last stage (`PipelineSchedule.step(micro_batches, loss_fn,
per_token=True)`: the loss_fn weighs each micro-batch, here 1/M each, and the step sums)
and per-token log-probs through the stages (`forward_only(per_token=True)`), on TP2, PP2 and
TP2+SP (2 gloo ranks), against the whole model in one process.

The task is DPO (trainer/dpo_loss.py) on pair micro-batches with random reference log-probs:
the loss, its metrics (broadcast to every rank) and every gradient (gathered whole) must equal
the single-process ones; the per-token log-probs must equal `Z2allForCausalLM.token_log_probs`.
"""

from __future__ import annotations

import torch

from parallel.layout_neutral_checkpoint import gather_full_tensors
from parallel.local_ranks import run_on_ranks
from parallel.parallel_dims import ParallelDims
from parallel.pipeline_parallel.schedules import PipelineSchedule
from parallel_plan.llama_pipeline import llama_stage, split_into_stage
from parallel_plan.llama_tensor_parallel import layouts_of, parallelize_model
from tests.model.model_helpers import small_model
from tests.parallel.grid_helpers import micro_batches_of
from trainer.dpo_loss import dpo_loss, sequence_log_prob

# name: (tensor_parallel, pipeline_parallel, sequence_parallel)
GRIDS = {"tp2": (2, 1, False), "pp2": (1, 2, False), "tp2_sp": (2, 1, True)}
NUM_MICRO = 3


def _pairs() -> list[dict[str, torch.Tensor]]:
    """Micro-batches of 2 pairs (rows: chosen, then rejected) with reference log-probs."""
    generator = torch.Generator().manual_seed(7)
    pairs = micro_batches_of(0, data_parallel=1, num_micro=2 * NUM_MICRO)[0]
    return [{**{key: torch.cat([first[key], second[key]]) for key in first},
             "reference_logps": -40 * torch.rand(4, generator=generator)}
            for first, second in zip(pairs[::2], pairs[1::2])]


def _dpo(token_logps: torch.Tensor, pair: dict[str, torch.Tensor]):
    logps, reference = sequence_log_prob(token_logps), pair["reference_logps"]
    out = dpo_loss(logps[:2], logps[2:], reference[:2], reference[2:], beta=0.5)
    margin = (out.chosen_rewards - out.rejected_rewards).mean()
    return out.loss, {"margin": margin, "chosen": out.chosen_rewards.mean()}


def _dpo_of_one_micro_batch(token_logps: torch.Tensor, pair: dict[str, torch.Tensor]):
    """The loss_fn: each micro-batch's share of the means over NUM_MICRO micro-batches."""
    loss, extras = _dpo(token_logps, pair)
    return loss / NUM_MICRO, {key: value / NUM_MICRO for key, value in extras.items()}


def _inputs(pair: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: pair[key] for key in ("input_ids", "labels", "attention_mask")}


def _on_rank(rank: int, world_size: int) -> dict:
    results = {}
    for name, (tensor_parallel, pipeline_parallel, sequence_parallel) in GRIDS.items():
        dims = ParallelDims(world_size, tensor_parallel, pipeline_parallel).build_groups()
        model = split_into_stage(small_model("gqa", seed=0), dims)
        if tensor_parallel > 1:
            parallelize_model(model, dims, sequence_parallel)
        schedule = PipelineSchedule(llama_stage(model, dims), dims, "1f1b", sequence_parallel)
        token_logps = schedule.forward_only(_inputs(_pairs()[0]), per_token=True)
        loss = schedule.step(_pairs(), _dpo_of_one_micro_batch, per_token=True)
        grads = gather_full_tensors({key: param.grad for key, param in model.named_parameters()},
                                    layouts_of(model.config), dims)
        results[name] = (token_logps.numpy(), float(loss), schedule.last_step_extras,
                         grads and {key: grad.numpy() for key, grad in grads.items()})
    return results


def test_task_loss_on_the_last_stage_equals_one_process():
    per_rank = run_on_ranks(_on_rank, world_size=2, timeout=300)
    model = small_model("gqa", seed=0)
    pairs = _pairs()
    with torch.no_grad():
        expected_logps = model.token_log_probs(**_inputs(pairs[0]))
    outputs = [_dpo(model.token_log_probs(**_inputs(pair)), pair) for pair in pairs]
    loss = torch.stack([loss for loss, _ in outputs]).mean()
    loss.backward()
    metrics = {key: float(torch.stack([extras[key] for _, extras in outputs]).mean())
               for key in outputs[0][1]}
    for name in GRIDS:
        for rank, results in enumerate(per_rank):  # every rank has the results
            token_logps, grid_loss, grid_metrics, _ = results[name]
            torch.testing.assert_close(torch.from_numpy(token_logps), expected_logps,
                                       rtol=1e-5, atol=1e-5, msg=f"{name} rank {rank}")
            assert abs(grid_loss - float(loss)) < 1e-5, (name, rank)
            assert grid_metrics.keys() == metrics.keys()
            for key, value in metrics.items():
                assert abs(grid_metrics[key] - value) < 1e-5, (name, rank, key)
        grads = per_rank[0][name][3]
        for key, param in model.named_parameters():
            torch.testing.assert_close(torch.from_numpy(grads[key]), param.grad, rtol=1e-4,
                                       atol=1e-6, msg=f"{name}: {key}")
