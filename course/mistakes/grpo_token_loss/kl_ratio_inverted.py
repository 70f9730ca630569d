"""the k3 KL written with π/π_ref instead of π_ref/π.

k3 = r − log r − 1 with r = π_ref/π is an unbiased estimate of KL(π ‖ π_ref) on tokens sampled
from π; with r = π/π_ref it estimates the reverse direction, and its value and gradient differ.
"""

from __future__ import annotations

import torch

from trainer.grpo_loss import TokenTerms


def token_terms(policy_logps: torch.Tensor, old_logps: torch.Tensor,
                reference_logps: torch.Tensor | None, advantages: torch.Tensor, *,
                epsilon_low: float, epsilon_high: float, beta: float) -> TokenTerms:
    advantages = advantages[:, None]
    ratio = torch.exp(policy_logps - old_logps)
    clipped_ratio = ratio.clamp(1 - epsilon_low, 1 + epsilon_high)
    loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
    kl = torch.zeros_like(loss)
    if beta != 0.0:
        log_policy_over_ref = policy_logps - reference_logps
        kl = torch.exp(log_policy_over_ref) - log_policy_over_ref - 1
        loss = loss + beta * kl
    return TokenTerms(loss, kl, (ratio < 1 - epsilon_low) & (advantages < 0),
                      (ratio > 1 + epsilon_high) & (advantages > 0))
