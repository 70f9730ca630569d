"""the population std (divided by n) instead of the sample std (n − 1).

TRL, torch's `std` and the project divide the squared deviations by n − 1; dividing by n makes
every advantage of a group of n scored answers larger by sqrt(n / (n − 1)). `nan_std` is the
sample std with NaNs left out.
"""

from __future__ import annotations

import torch

from trainer.grpo_loss import SCALE_REWARDS, STD_EPSILON


def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str,
                     batch_std: float | None = None) -> torch.Tensor:
    groups = rewards.view(-1, group_size)
    deviations = groups - groups.nanmean(dim=1, keepdim=True)
    advantages = deviations.flatten()
    if scale_rewards == "group":
        std = deviations.pow(2).nanmean(dim=1).sqrt()
        advantages = advantages / (std.repeat_interleave(group_size) + STD_EPSILON)
    elif scale_rewards == "batch":
        if batch_std is None:
            raise ValueError("scale_rewards='batch' needs the global batch's reward std")
        advantages = advantages / (batch_std + STD_EPSILON)
    elif scale_rewards != "none":
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    return advantages.nan_to_num(nan=0.0)
