"""The one thing that differs between tasks: how a batch becomes a loss.

    loss, extras = forward_step(ddp_model, batch)     # extras: metrics to log, e.g. DPO rewards

Pretraining and SFT minimise next-token cross entropy (SFT's labels are -100 outside the
assistant's answers); DPO compares the policy's and a frozen reference model's
log-probabilities of a chosen and a rejected answer (utils/dpo.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from model.loading import load_model
from parallel.distributed_data_parallel import DistributedDataParallel
from trainer.options import DPOOptions
from utils.dpo import chosen_answer_nll, dpo_loss, sequence_log_prob
from utils.precision import DTYPES

Batch = dict[str, torch.Tensor]
StepOutput = tuple[torch.Tensor, dict[str, torch.Tensor]]  # (loss, extras to log)
ForwardStep = Callable[[DistributedDataParallel, Batch], StepOutput]


def forward_language_model(model: DistributedDataParallel, batch: Batch
                           ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Pretraining and SFT: mean cross entropy over the target tokens (labels != -100)."""
    output = model(batch["input_ids"], labels=batch["labels"],
                   attention_mask=batch.get("attention_mask"))
    return output.loss, {}


def forward_dpo(model: DistributedDataParallel, batch: Batch, *, reference: torch.nn.Module,
                beta: float, label_smoothing: float, nll_weight: float
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO: chosen and rejected go through the policy as one batch of 2B sequences (the
    collator pads both sides to one length). `model.module.token_log_probs` skips DDP's
    forward, which is a plain pass-through: our DDP hooks the parameters, not the forward."""
    pair = {key: torch.cat([batch[f"chosen_{key}"], batch[f"rejected_{key}"]])
            for key in ("input_ids", "labels", "attention_mask")}
    policy_token_logps = model.module.token_log_probs(**pair)
    policy_logps = sequence_log_prob(policy_token_logps)
    with torch.no_grad():
        reference_logps = sequence_log_prob(reference.token_log_probs(**pair))
    half = batch["chosen_input_ids"].shape[0]
    out = dpo_loss(policy_logps[:half], policy_logps[half:], reference_logps[:half],
                   reference_logps[half:], beta=beta, label_smoothing=label_smoothing)
    chosen_nll = chosen_answer_nll(policy_token_logps[:half], batch["chosen_labels"])
    return out.loss + nll_weight * chosen_nll, {
        "dpo_loss": out.loss, "chosen_nll": chosen_nll,
        "rewards/chosen": out.chosen_rewards.mean(),
        "rewards/rejected": out.rejected_rewards.mean(),
        "rewards/accuracies": out.reward_accuracy, "rewards/margins": out.reward_margin}


def build_forward_step(task_type: str, dpo: DPOOptions, init_from: str | None,
                       device: torch.device, dtype_name: str) -> ForwardStep:
    """The task's forward step. DPO's reference is the SFT model we started from: always
    `init_from`, never a copy of the policy (after a resume the policy has moved on)."""
    if task_type != "dpo":
        return forward_language_model
    reference = load_model(init_from)[0].to(device, DTYPES[dtype_name]).eval()
    reference.requires_grad_(False)
    return functools.partial(forward_dpo, reference=reference, beta=dpo.dpo_beta,
                             label_smoothing=dpo.dpo_label_smoothing,
                             nll_weight=dpo.dpo_nll_weight)
