"""Our GRPO objective against TRL's `GRPOTrainer` on the same log-probs, rewards and masks.

The loss: TRL's own `_compute_loss` runs on a stand-in trainer whose forward returns the given
per-token log-probs, and our `GRPOStep` runs on a stand-in model returning the same ones; the
losses and their gradients must agree for every loss type, clip and KL weight. The advantages:
TRL computes them inside `_generate_and_score_completions` (which samples and scores too), so
its few lines are written out here, with TRL's own `nanstd`, and compared with
`group_advantages`.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import nanstd

from trainer.forward_steps import GRPOStep
from trainer.global_batch import attach_per_replica, term_counts
from trainer.grpo_loss import group_advantages
from utils.labels import IGNORE_INDEX

ANSWERS, LENGTH, MAX_COMPLETION_LENGTH = 6, 5, 7


def rollouts(seed: int) -> dict[str, torch.Tensor]:
    """Random log-probs of the policy, the sampling policy and the reference on 6 answers of
    up to 5 tokens (a mask with different lengths), and their advantages."""
    generator = torch.Generator().manual_seed(seed)
    policy = -torch.rand(ANSWERS, LENGTH, generator=generator, dtype=torch.float64) * 3
    lengths = torch.tensor([5, 3, 1, 4, 5, 2])
    return {"policy": policy,
            "old": policy + 0.3 * torch.randn(ANSWERS, LENGTH, generator=generator,
                                              dtype=torch.float64),
            "reference": policy + 0.5 * torch.randn(ANSWERS, LENGTH, generator=generator,
                                                    dtype=torch.float64),
            "advantages": torch.randn(ANSWERS, generator=generator, dtype=torch.float64),
            "mask": (torch.arange(LENGTH)[None, :] < lengths[:, None]).long()}


def trl_loss(data: dict[str, torch.Tensor], policy: torch.Tensor, loss_type: str, beta: float,
             epsilon_low: float, epsilon_high: float) -> torch.Tensor:
    trainer = SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level="token", beta=beta, loss_type=loss_type,
        epsilon_low=epsilon_low, epsilon_high=epsilon_high, use_vllm=False,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None),
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        max_completion_length=MAX_COMPLETION_LENGTH, _entropy_bonus_enabled=False,
        aux_loss_enabled=False, _metrics={"train": _Metrics()},
        accelerator=SimpleNamespace(reduce=lambda tensor, reduction: tensor,
                                    gather=lambda tensor: tensor),
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (
            policy, torch.zeros_like(policy), None))
    inputs = {"prompt_ids": torch.zeros(ANSWERS, 1, dtype=torch.long),
              "prompt_mask": torch.ones(ANSWERS, 1, dtype=torch.long),
              "completion_ids": torch.zeros(ANSWERS, LENGTH, dtype=torch.long),
              "completion_mask": data["mask"], "advantages": data["advantages"],
              "old_per_token_logps": data["old"], "ref_per_token_logps": data["reference"]}
    return GRPOTrainer._compute_loss(trainer, None, inputs)


class _Metrics(dict):
    def __missing__(self, key):
        self[key] = []
        return self[key]


def our_loss(data: dict[str, torch.Tensor], policy: torch.Tensor, loss_type: str, beta: float,
             epsilon_low: float, epsilon_high: float) -> torch.Tensor:
    """GRPOStep on one micro-batch in one process: rows of one prompt token + the answer, the
    labels on the answer (so our [B, 1 + L] log-probs are TRL's [B, L] and a zero). `data`
    without "old": a batch without `old_logps`, as a rollout used once is."""
    labels = torch.full((ANSWERS, LENGTH + 1), IGNORE_INDEX)
    labels[:, :LENGTH] = torch.where(data["mask"].bool(), 1, IGNORE_INDEX)
    padded = {key: torch.cat([data[key], torch.zeros(ANSWERS, 1, dtype=torch.float64)], dim=1)
              for key in ("old", "reference") if key in data}
    batch = {"input_ids": torch.zeros(ANSWERS, LENGTH + 1, dtype=torch.long), "labels": labels,
             "attention_mask": torch.ones(ANSWERS, LENGTH + 1, dtype=torch.long),
             "advantages": data["advantages"], "reference_logps": padded["reference"]}
    if "old" in padded:
        batch["old_logps"] = padded["old"]
    attach_per_replica([batch], term_counts(batch), replicas=1)
    model = SimpleNamespace(token_log_probs=lambda **inputs: torch.cat(
        [policy, torch.zeros(ANSWERS, 1, dtype=torch.float64)], dim=1))
    step = GRPOStep(epsilon_low=epsilon_low, epsilon_high=epsilon_high, beta=beta,
                    loss_type=loss_type, max_completion_length=MAX_COMPLETION_LENGTH)
    return step(model, batch)[0]


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize(("beta", "epsilon_low", "epsilon_high"),
                         [(0.0, 0.2, 0.2), (0.04, 0.2, 0.2), (0.1, 0.1, 0.28)],
                         ids=["no KL", "KL", "DAPO clip"])
def test_the_loss_and_its_gradient_equal_trls(loss_type, beta, epsilon_low, epsilon_high):
    data = rollouts(seed=7)
    results = []
    for loss_function in (trl_loss, our_loss):
        policy = data["policy"].clone().requires_grad_(True)
        loss = loss_function(data, policy, loss_type, beta, epsilon_low, epsilon_high)
        loss.backward()
        results.append((loss.detach(), policy.grad))
    (trl_value, trl_grad), (our_value, our_grad) = results
    assert trl_value.abs() > 1e-3  # a loss that could differ
    torch.testing.assert_close(our_value, trl_value, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(our_grad, trl_grad, rtol=1e-12, atol=1e-12)


def test_the_first_iteration_is_on_policy():
    """Without `old_logps` (one iteration per batch) the ratio is 1: as TRL, the sampling
    policy's log-probs are this forward's, detached, and the gradient is the policy
    gradient −A ∂log π per token (normalized)."""
    data = rollouts(seed=3)
    data_on_policy = {key: value for key, value in data.items() if key != "old"}
    ours = our_loss(data_on_policy, data["policy"], "bnpo", 0.0, 0.2, 0.2)
    expected = -(data["advantages"][:, None] * data["mask"]).sum() / data["mask"].sum()
    torch.testing.assert_close(ours, expected)


def trl_advantages(rewards: torch.Tensor, group: int, scale_rewards: str) -> torch.Tensor:
    """grpo_trainer.py's "sum_then_normalize" lines, as TRL 1.16 writes them."""
    mean_grouped = torch.nanmean(rewards.view(-1, group), dim=1).repeat_interleave(group)
    if scale_rewards in ("group", "none"):
        std = nanstd(rewards.view(-1, group), dim=1).repeat_interleave(group)
    else:
        std = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_the_advantages_equal_trls(scale_rewards):
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 2.0, math.nan, 1.0, 0.0,
                            math.nan, math.nan, math.nan, math.nan], dtype=torch.float64)
    batch_std = float(nanstd(rewards))
    ours = group_advantages(rewards, 4, scale_rewards, batch_std=batch_std)
    torch.testing.assert_close(ours, trl_advantages(rewards, 4, scale_rewards))
    assert ours[4:8].abs().max() == 0  # a group of equal rewards teaches nothing
    assert ours[12:].abs().max() == 0  # nor does one that nothing scored
