"""the label-smoothing weights swapped between log σ(h) and log σ(−h).

cDPO assumes a fraction ε of the labels are flipped: (1 − ε) of the weight stays on log σ(h), ε
goes to log σ(−h).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.dpo_loss import DPOOutput


def dpo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
             reference_chosen_logps: torch.Tensor, reference_rejected_logps: torch.Tensor,
             beta: float = 0.1, label_smoothing: float = 0.0) -> DPOOutput:
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    chosen_log_ratio = policy_chosen_logps - reference_chosen_logps
    rejected_log_ratio = policy_rejected_logps - reference_rejected_logps
    logits = beta * (chosen_log_ratio - rejected_log_ratio)
    losses = -label_smoothing * F.logsigmoid(logits) - (1 - label_smoothing) * F.logsigmoid(-logits)
    return DPOOutput(loss=losses.mean(), chosen_rewards=(beta * chosen_log_ratio).detach(),
                     rejected_rewards=(beta * rejected_log_ratio).detach())
