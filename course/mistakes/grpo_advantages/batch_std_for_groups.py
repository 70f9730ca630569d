"""divided by the whole batch's std when the group's is asked for.

With --scale_rewards group, each answer is measured against its own group: (r − the group's
mean) / (the group's std + ε). The batch's std mixes easy and hard prompts, so a group whose
rewards barely differ gets tiny advantages instead of ±1-sized ones.
"""

from __future__ import annotations

import torch

from trainer.grpo_loss import SCALE_REWARDS, STD_EPSILON, nan_std


def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str,
                     batch_std: float | None = None) -> torch.Tensor:
    groups = rewards.view(-1, group_size)
    advantages = (groups - groups.nanmean(dim=1, keepdim=True)).flatten()
    if scale_rewards == "group":
        advantages = advantages / (nan_std(rewards.view(1, -1)) + STD_EPSILON)
    elif scale_rewards == "batch":
        if batch_std is None:
            raise ValueError("scale_rewards='batch' needs the global batch's reward std")
        advantages = advantages / (batch_std + STD_EPSILON)
    elif scale_rewards != "none":
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    return advantages.nan_to_num(nan=0.0)
