"""the reference model left out (log-ratios of the policy alone).

DPO's margin compares the policy with the frozen reference: beta * [(log pi - log
pi_ref)(chosen) - (log pi - log pi_ref)(rejected)]; without pi_ref the loss at pi = pi_ref is
not log 2.
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
    logits = beta * (policy_chosen_logps - policy_rejected_logps)
    losses = -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    return DPOOutput(loss=losses.mean(), chosen_rewards=(beta * policy_chosen_logps).detach(),
                     rejected_rewards=(beta * policy_rejected_logps).detach())
