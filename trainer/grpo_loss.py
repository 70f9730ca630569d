"""The GRPO objective (Shao et al. 2024, "DeepSeekMath", §4.1; DeepSeek-R1 trains with it).

For each prompt q the sampling policy π_old writes a *group* of G answers o_1..o_G, a reward
function scores them r_1..r_G, and each answer's advantage is how much better it did than its
group:

    A_i = (r_i − mean(r_1..r_G)) / (std(r_1..r_G) + 1e-4)         (--scale_rewards group)

No value network is needed: the group's mean is the baseline. Every token t of answer i then
gets PPO's clipped surrogate, with the ratio of the policy being trained to the one that
sampled, and a KL penalty toward the frozen reference π_ref (the model we started from):

    ρ_it = π(o_it | q, o_i<t) / π_old(o_it | q, o_i<t)
    ℓ_it = −min(ρ_it · A_i, clip(ρ_it, 1 − ε_low, 1 + ε_high) · A_i) + β · KL_it
    KL_it = π_ref/π − log(π_ref/π) − 1      (Schulman's "k3" estimator: ≥ 0, unbiased)

Why each piece. Groups: answers to one prompt share its difficulty, so comparing within the
group removes it (an easy prompt's all-correct group teaches nothing: its advantages are 0).
The clip: after one update on a batch (--grpo_iterations > 1 reuses it) ρ moves away from 1, and
clipping stops a token from being pushed further once it already gained more than ε. DAPO (Yu
et al. 2025) raises only the upper bound (--grpo_epsilon_high), so unlikely good tokens can
grow. The KL term keeps the policy near the reference; β = 0 drops it, and the reference's
forward with it.

How the per-token losses become one number (--grpo_loss_type), each over the global batch of
answers (trainer/global_batch.py: the same objective on every layout):

    grpo     mean over answers of (mean over the answer's tokens)   long answers weigh less
    bnpo     sum over every token / number of answer tokens          each token weighs the same
    dr_grpo  sum over every token / (answers × max_completion_length)   (Dr. GRPO, Liu et al.
             2025: no length bias at all; with --scale_rewards none, no difficulty bias either)

TRL's `GRPOTrainer` computes the same (tests/trainer/test_grpo_loss.py compares them).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

STD_EPSILON = 1e-4  # added to the std: a group of nearly equal rewards must not blow up
SCALE_REWARDS = ("group", "batch", "none")
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo")


def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str,
                     batch_std: float | None = None) -> torch.Tensor:
    """A_i for rewards [N] that hold N / group_size groups of consecutive answers; NaN (an answer
    no reward function scored) is left out of its group's mean and std and gets advantage 0.
    `scale_rewards`: divide by the group's std, by the whole global batch's (`batch_std`,
    which every rank must share: Hu et al. 2025, REINFORCE++), or not at all (Dr. GRPO).
    The std is the sample std (n − 1), as torch's and TRL's."""
    groups = rewards.view(-1, group_size)
    advantages = (groups - groups.nanmean(dim=1, keepdim=True)).flatten()
    if scale_rewards == "group":
        advantages = advantages / (nan_std(groups).repeat_interleave(group_size)
                                   + STD_EPSILON)
    elif scale_rewards == "batch":
        if batch_std is None:
            raise ValueError("scale_rewards='batch' needs the global batch's reward std")
        advantages = advantages / (batch_std + STD_EPSILON)
    elif scale_rewards != "none":
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    return advantages.nan_to_num(nan=0.0)


def nan_std(groups: torch.Tensor) -> torch.Tensor:
    """The sample std of each row [G, n] -> [G], NaNs left out."""
    count = (~groups.isnan()).sum(dim=1)
    squares = (groups - groups.nanmean(dim=1, keepdim=True)).pow(2).nansum(dim=1)
    return (squares / (count - 1)).sqrt()


class TokenTerms(NamedTuple):
    """Per-token pieces of the objective, each [B, T]."""

    loss: torch.Tensor          # ℓ_it (with the KL term when β > 0)
    kl: torch.Tensor            # KL_it (zeros when β = 0)
    low_clipped: torch.Tensor   # ρ < 1 − ε_low with A < 0: the clip held the token back
    high_clipped: torch.Tensor  # ρ > 1 + ε_high with A > 0


def token_terms(policy_logps: torch.Tensor, old_logps: torch.Tensor,
                reference_logps: torch.Tensor | None, advantages: torch.Tensor, *,
                epsilon_low: float, epsilon_high: float, beta: float) -> TokenTerms:
    """ℓ_it of the module docstring from token log-probs [B, T] (π, π_old, π_ref) and the
    answers' advantages [B]."""
    advantages = advantages[:, None]
    ratio = torch.exp(policy_logps - old_logps)
    clipped_ratio = ratio.clamp(1 - epsilon_low, 1 + epsilon_high)
    loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
    kl = torch.zeros_like(loss)
    if beta != 0.0:
        log_ref_over_policy = reference_logps - policy_logps
        kl = torch.exp(log_ref_over_policy) - log_ref_over_policy - 1
        loss = loss + beta * kl
    return TokenTerms(loss, kl, (ratio < 1 - epsilon_low) & (advantages < 0),
                      (ratio > 1 + epsilon_high) & (advantages > 0))


def loss_sum(token_loss: torch.Tensor, mask: torch.Tensor, loss_type: str,
             max_completion_length: int) -> torch.Tensor:
    """The micro-batch's sum that `--grpo_loss_type` divides by a global count: answers (grpo,
    dr_grpo) or answer tokens (bnpo). `mask` [B, T] is 1 on answer tokens."""
    masked = token_loss * mask
    if loss_type == "grpo":
        return (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).sum()
    if loss_type == "bnpo":
        return masked.sum()
    if loss_type == "dr_grpo":
        return masked.sum() / max_completion_length
    raise ValueError(f"grpo_loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


def counted_by_tokens(loss_type: str) -> bool:
    """Whether `loss_sum` of this type is divided by answer tokens (else by answers)."""
    return loss_type == "bnpo"
