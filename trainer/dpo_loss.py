"""The DPO loss (Rafailov et al. 2023, "Direct Preference Optimization", eq. 7).

Given a prompt x with a preferred answer y_w ("chosen") and a dispreferred one y_l ("rejected"),
the policy π is trained against a frozen reference π_ref (the SFT model) with

    h      = β · [ (log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x)) ]
    loss   = −(1 − ε) · log σ(h) − ε · log σ(−h)

where log π(y|x) is the *sum* of the answer tokens' log-probabilities. ε = 0 is plain DPO;
ε > 0 is "conservative DPO" (cDPO, Mitchell 2023): it assumes a fraction ε of the preference
labels are flipped, so the loss no longer pushes h to infinity. The implicit rewards
β · (log π − log π_ref) are what we log: their gap ("margin") should grow and the fraction of
pairs where chosen beats rejected ("accuracy") should rise above 0.5. At π = π_ref, h = 0 and
the loss is log 2 for every ε.

DPO only asks chosen to beat rejected; both likelihoods may fall together, and with them the
quality of what the model generates. RPO (Pang et al. 2024, "Iterative Reasoning Preference
Optimization") adds α × the chosen answers' negative log-likelihood per token to the loss
(`--dpo_nll_weight=α`), which keeps the chosen answers likely.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from utils.labels import IGNORE_INDEX


class DPOOutput(NamedTuple):
    loss: torch.Tensor              # scalar, mean over the batch
    chosen_rewards: torch.Tensor    # [B], β·(log π(y_w) − log π_ref(y_w)), detached
    rejected_rewards: torch.Tensor  # [B], β·(log π(y_l) − log π_ref(y_l)), detached


def sequence_log_prob(token_log_probs: torch.Tensor) -> torch.Tensor:
    """[B, T] per-token log-probs (0 where not trained) -> [B] log π(answer | prompt)."""
    return token_log_probs.sum(dim=-1)


def chosen_answer_nll_sum(token_log_probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood of the chosen answers' trained tokens (labels != -100), summed:
    the trainer divides it by the global batch's count of those tokens (RPO's per-token mean)."""
    return -(token_log_probs * (labels != IGNORE_INDEX)).sum()


def dpo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
             reference_chosen_logps: torch.Tensor, reference_rejected_logps: torch.Tensor,
             beta: float = 0.1, label_smoothing: float = 0.0) -> DPOOutput:
    """Sigmoid DPO loss (with cDPO label smoothing) from per-sequence log-probs, all [B]."""
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    chosen_log_ratio = policy_chosen_logps - reference_chosen_logps
    rejected_log_ratio = policy_rejected_logps - reference_rejected_logps
    logits = beta * (chosen_log_ratio - rejected_log_ratio)
    # logsigmoid is the numerically stable log σ (no overflow for large |h|)
    losses = -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    return DPOOutput(loss=losses.mean(),
                     chosen_rewards=(beta * chosen_log_ratio).detach(),
                     rejected_rewards=(beta * rejected_log_ratio).detach())
