"""an unscored (NaN) answer's advantage left NaN.

An answer no reward function scored has no advantage: it must be 0 (it teaches nothing), not
NaN, which would turn the whole loss and every gradient into NaN. The same `nan_to_num` zeroes
a group with one scored answer (its sample std is 0 / 0).
"""

from __future__ import annotations

import torch

from trainer.grpo_loss import SCALE_REWARDS, STD_EPSILON, nan_std


def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str,
                     batch_std: float | None = None) -> torch.Tensor:
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
    return advantages
