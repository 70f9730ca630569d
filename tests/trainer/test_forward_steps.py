"""The forward steps' shares (trainer/global_batch.py) against the formulas, computed here on the
whole batch in float64: split into micro-batches of unequal sizes and counted per replica, the
shares summed over micro-batches and averaged over replicas are the global batch's token-mean
cross entropy, and DPO's per-pair loss, rewards, accuracy and margin and RPO's per-token NLL."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.distributed_env import DistributedEnv
from trainer.forward_steps import DPOStep, language_model_objective
from trainer.global_batch import attach_per_replica, global_counts

ONE_PROCESS = DistributedEnv(rank=0, world_size=1, local_rank=0, local_world_size=1,
                             device=torch.device("cpu"))


def _labels(rows: int, width: int, generator: torch.Generator) -> torch.Tensor:
    """Random targets with a random-length ignored prompt in each row (SFT's shape)."""
    labels = torch.randint(0, 50, (rows, width), generator=generator)
    for row in range(rows):
        labels[row, :int(torch.randint(1, width, (), generator=generator))] = -100
    return labels


def _split(batch: dict[str, torch.Tensor], sizes: list[int]) -> list[dict[str, torch.Tensor]]:
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [{key: value[start:start + size] for key, value in batch.items()}
            for start, size in zip(starts, sizes)]


@pytest.mark.parametrize("replicas, sizes", [(1, [5]), (1, [1, 4]), (2, [2, 3]), (3, [1, 1, 3])])
def test_language_model_shares_sum_to_the_global_token_mean(replicas, sizes):
    generator = torch.Generator().manual_seed(0)
    labels = _labels(5, 9, generator)
    token_nll = torch.rand(5, 9, generator=generator, dtype=torch.float64) * (labels != -100)
    micro_batches = _split({"labels": labels, "nll": token_nll}, sizes)
    attach_per_replica(micro_batches, global_counts(micro_batches, True, ONE_PROCESS), replicas)
    shares = []
    for batch in micro_batches:  # the model's loss: the micro-batch's own mean
        mean = batch["nll"].sum() / (batch["labels"] != -100).sum()
        shares.append(language_model_objective(mean, batch)[0])
    expected = float(token_nll.sum() / (labels != -100).sum())
    assert float(sum(shares)) / replicas == pytest.approx(expected, rel=1e-6)  # (fp32 N / D)


def _dpo_reference(policy, reference, chosen_nll_tokens, beta, nll_weight):
    """Per-pair DPO (Rafailov et al. eq. 7) and RPO's per-token NLL, in Python floats."""
    pairs = len(policy) // 2
    rewards = [(beta * (policy[i] - reference[i]), beta * (policy[pairs + i]
               - reference[pairs + i])) for i in range(pairs)]
    dpo = sum(math.log1p(math.exp(-(c - r))) for c, r in rewards) / pairs
    nll = sum(chosen_nll_tokens) / len(chosen_nll_tokens)
    return {"loss": dpo + nll_weight * nll, "dpo_loss": dpo, "chosen_nll": nll,
            "rewards/chosen": sum(c for c, _ in rewards) / pairs,
            "rewards/rejected": sum(r for _, r in rewards) / pairs,
            "rewards/accuracies": sum(c > r for c, r in rewards) / pairs,
            "rewards/margins": sum(c - r for c, r in rewards) / pairs}


@pytest.mark.parametrize("sizes", [[4], [1, 3], [3, 1]])
def test_dpo_shares_sum_to_the_formulas(sizes):
    generator = torch.Generator().manual_seed(1)
    pairs, width, beta, nll_weight = 4, 7, 0.5, 0.2
    batch = {f"{side}_{key}": value for side in ("chosen", "rejected")
             for key, value in (("labels", _labels(pairs, width, generator)),
                                ("input_ids", torch.zeros(pairs, width, dtype=torch.long)),
                                ("attention_mask", torch.ones(pairs, width, dtype=torch.long)))}
    token_logps = {side: -torch.rand(pairs, width, generator=generator, dtype=torch.float64)
                   * (batch[f"{side}_labels"] != -100) for side in ("chosen", "rejected")}
    reference = -torch.rand(2 * pairs, generator=generator, dtype=torch.float64) * 5
    step = DPOStep(reference_log_probs=None, beta=beta, label_smoothing=0.0,
                   nll_weight=nll_weight)
    micro_batches = _split(batch, sizes)
    attach_per_replica(micro_batches, global_counts(micro_batches, True, ONE_PROCESS), 1)
    sums: dict[str, float] = {}
    start = 0
    for micro_batch, size in zip(micro_batches, sizes):
        rows = slice(start, start + size)
        pair = {**micro_batch, "labels": torch.cat([micro_batch["chosen_labels"],
                                                    micro_batch["rejected_labels"]]),
                "reference_logps": torch.cat([reference[:pairs][rows], reference[pairs:][rows]])}
        loss, extras = step.objective(torch.cat([token_logps["chosen"][rows],
                                                 token_logps["rejected"][rows]]), pair)
        for key, value in {"loss": loss, **extras}.items():
            sums[key] = sums.get(key, 0.0) + float(value)
        start += size
    policy = torch.cat([token_logps["chosen"].sum(-1), token_logps["rejected"].sum(-1)])
    trained = batch["chosen_labels"] != -100
    expected = _dpo_reference(policy.tolist(), reference.tolist(),
                              (-token_logps["chosen"][trained]).tolist(), beta, nll_weight)
    assert sums == pytest.approx(expected, rel=1e-6)
