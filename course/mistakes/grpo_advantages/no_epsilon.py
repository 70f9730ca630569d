"""the std used without its epsilon.

A group whose rewards nearly agree has a std near 0: without the 1e-4 (STD_EPSILON) added to
it, the division blows its tiny differences up to ±1-sized advantages, and TRL's values differ.
"""

from __future__ import annotations

import torch

from trainer.grpo_loss import SCALE_REWARDS, nan_std


def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str,
                     batch_std: float | None = None) -> torch.Tensor:
    groups = rewards.view(-1, group_size)
    advantages = (groups - groups.nanmean(dim=1, keepdim=True)).flatten()
    if scale_rewards == "group":
        advantages = advantages / nan_std(groups).repeat_interleave(group_size)
    elif scale_rewards == "batch":
        if batch_std is None:
            raise ValueError("scale_rewards='batch' needs the global batch's reward std")
        advantages = advantages / batch_std
    elif scale_rewards != "none":
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    return advantages.nan_to_num(nan=0.0)
