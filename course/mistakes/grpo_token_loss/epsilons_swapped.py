"""the clip's bounds built with ε_low and ε_high swapped.

The range is [1 − ε_low, 1 + ε_high]: DAPO's larger ε_high lets a good but unlikely token grow
further; swapped, it lets a bad token fall further instead (the two agree only when ε_low =
ε_high, so only the DAPO-clip case shows it).
"""

from __future__ import annotations

import torch

from trainer.grpo_loss import TokenTerms


def token_terms(policy_logps: torch.Tensor, old_logps: torch.Tensor,
                reference_logps: torch.Tensor | None, advantages: torch.Tensor, *,
                epsilon_low: float, epsilon_high: float, beta: float) -> TokenTerms:
    advantages = advantages[:, None]
    ratio = torch.exp(policy_logps - old_logps)
    clipped_ratio = ratio.clamp(1 - epsilon_high, 1 + epsilon_low)
    loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
    kl = torch.zeros_like(loss)
    if beta != 0.0:
        log_ref_over_policy = reference_logps - policy_logps
        kl = torch.exp(log_ref_over_policy) - log_ref_over_policy - 1
        loss = loss + beta * kl
    return TokenTerms(loss, kl, (ratio < 1 - epsilon_low) & (advantages < 0),
                      (ratio > 1 + epsilon_high) & (advantages > 0))
