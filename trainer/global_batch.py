"""One global batch, one objective: every loss term is a sum over the whole global batch divided
by the global batch's count of what it sums, however the batch is split.

Why. The global batch of one optimizer step is split over gradient-accumulation micro-batches
and data-parallel replicas. Averaging each micro-batch's own mean, then averaging those, weighs
a token by 1 / (tokens of its micro-batch): two SFT micro-batches of 10 and 30 answer tokens
give each token of the first 3x the weight of one of the second. The objective, its gradient
and the logged loss then depend on --batch_size, --gradient_accumulation_steps and the number
of ranks (measured on the demo's SFT data, step 1, one global batch of 4: 6.3059 on 2 ranks,
6.2791 with accumulation, 6.2902 in one process). Pretraining rows are full, so its means
agreed by luck; SFT and DPO rows are not. (HF Trainer had the same bug until 2024, and fixed it
by dividing by the global number of loss tokens, as here.)

The rule. Before the forward passes of a step, each term's count over the global batch is
summed over the micro-batches and all-reduced over the replicas (the ranks that hold a copy of
a replica's batch, tensor/pipeline/context-parallel peers, count it once: `DataShare`):

    term                  summed over                 divided by
    cross entropy         target tokens (labels≠-100) the global batch's target tokens N
    DPO loss, rewards     pairs                       the global batch's pairs P
    DPO's RPO NLL         chosen answers' tokens      the global batch's chosen tokens N_c
    GRPO (grpo, dr_grpo)  completions                 the global batch's completions C
    GRPO bnpo, metrics    completion tokens           the global batch's completion tokens

DDP *averages* the D replicas' gradients, so each replica divides its sum by N / D (the
per-replica share of the count, `per_replica`): the average of the D replicas' gradients is then
the gradient of (sum over all N tokens) / N. Worked example, D = 2 replicas, one micro-batch
each, 10 and 30 target tokens: N / D = 20; replica 0's loss is S0 / 20, replica 1's S1 / 20;
DDP's average (S0 + S1) / 40 = the global token mean. Summed over a replica's micro-batches,
its losses average over the replicas to the global batch's objective, which is what the log
shows.

The totals travel inside each micro-batch (`PER_REPLICA_KEYS`), so a forward step reads them
wherever it runs: in the loop, or on a pipeline's last stage (trainer/forward_steps.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from trainer.distributed_env import DistributedEnv, all_reduce_sum
from utils.labels import IGNORE_INDEX

# One micro-batch: its tensors by name (input_ids, labels, ..., DPO's chosen_* and rejected_*),
# plus the per-replica counts `attach_per_replica` adds. Every forward step takes one.
Batch = dict[str, torch.Tensor]

TARGET_TOKENS = "target_tokens_per_replica"
PAIRS = "pairs_per_replica"
CHOSEN_TOKENS = "chosen_tokens_per_replica"
COMPLETIONS = "completions_per_replica"
COMPLETION_TOKENS = "completion_tokens_per_replica"
PER_REPLICA_KEYS = (TARGET_TOKENS, PAIRS, CHOSEN_TOKENS, COMPLETIONS, COMPLETION_TOKENS)


def term_counts(batch: Batch) -> dict[str, float]:
    """What each loss term of this micro-batch sums over: its target tokens (pretraining, SFT),
    its pairs and the chosen answers' target tokens (DPO: `chosen_*` keys), or its completions
    and their tokens (GRPO's rollouts: `advantages`)."""
    if "advantages" in batch:
        return {COMPLETIONS: float(batch["labels"].shape[0]),
                COMPLETION_TOKENS: float((batch["labels"] != IGNORE_INDEX).sum())}
    if "chosen_labels" in batch:
        return {PAIRS: float(batch["chosen_labels"].shape[0]),
                CHOSEN_TOKENS: float((batch["chosen_labels"] != IGNORE_INDEX).sum())}
    return {TARGET_TOKENS: float((batch["labels"] != IGNORE_INDEX).sum())}


def global_counts(micro_batches: Iterable[Batch], counts_here: bool, env: DistributedEnv
                  ) -> dict[str, float]:
    """Collective: each term's count summed over `micro_batches` and every rank's.
    `counts_here`: this rank counts its batches (one rank per replica does; the others, which
    hold copies, add 0)."""
    local: dict[str, float] = {}
    for batch in micro_batches:
        for key, count in term_counts(batch).items():
            local[key] = local.get(key, 0.0) + (count if counts_here else 0.0)
    keys = sorted(local)
    return dict(zip(keys, all_reduce_sum([local[key] for key in keys], env)))


def attach_per_replica(micro_batches: list[Batch], totals: dict[str, float], replicas: int
                       ) -> None:
    """Adds to every micro-batch (in place) each term's global count divided by the number of
    data-parallel `replicas`, which DDP's average of their gradients divides back out."""
    for key, total in totals.items():
        # an all-ignored global batch (possible in SFT) has loss 0, not 0/0
        per_replica = max(total, 1.0) / replicas
        for batch in micro_batches:
            batch[key] = torch.tensor(per_replica, dtype=torch.float32,
                                      device=_device_of(batch))


def _device_of(batch: Batch) -> torch.device:
    return next(iter(batch.values())).device


def share(value_sum: torch.Tensor, batch: Batch, key: str) -> torch.Tensor:
    """This micro-batch's part of a global-batch mean: its sum divided by the per-replica
    count `key` that `attach_per_replica` put in the batch."""
    return value_sum / batch[key]
