"""The one thing that differs between tasks: how a batch becomes a loss.

    loss, extras = forward_step(model, batch)     # extras: metrics to log, e.g. DPO rewards

Both are this micro-batch's *share* of the global batch's means: its sums divided by the
global batch's counts per data-parallel replica, which the loop put in the batch
(trainer/global_batch.py). A replica's shares summed over its micro-batches, averaged over the
replicas, are the global batch's loss and metrics, whatever the split.

`model` is anything that computes like our causal LM (`CausalLM`): the model itself (inside
a data-parallel wrapper, whose forward is the model's: the wrappers hook parameters and
blocks, not the call), or on a pipeline the stages run forward-only (trainer/model_parallel.py).

Pretraining and SFT minimise next-token cross entropy (SFT's labels are -100 outside the
assistant's answers); DPO compares the policy's and a frozen reference model's
log-probabilities of a chosen and a rejected answer (trainer/dpo_loss.py). With LoRA the reference
is the policy itself with its adapters switched off (model/lora.py: the frozen base, no second
copy of the weights). GRPO's micro-batches are the policy's own sampled answers with their
advantages (trainer/rollouts.py), and its step is the clipped, KL-penalized surrogate of
trainer/grpo_loss.py.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from model.loading import load_model
from model.lora import adapters_disabled
from trainer.dpo_loss import chosen_answer_nll_sum, dpo_loss, sequence_log_prob
from trainer.global_batch import (
    CHOSEN_TOKENS,
    COMPLETION_TOKENS,
    COMPLETIONS,
    PAIRS,
    TARGET_TOKENS,
    Batch,
    share,
)
from trainer.grpo_loss import counted_by_tokens, loss_sum, token_terms
from trainer.options import DPOOptions, GRPOOptions
from utils.labels import IGNORE_INDEX
from utils.precision import DTYPES

StepOutput = tuple[torch.Tensor, dict[str, torch.Tensor]]  # (loss, extras to log)


class CausalLM(Protocol):
    """What a forward step calls: `Z2allForCausalLM`'s two entry points."""

    def __call__(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None) -> Any: ...  # `.loss`

    def token_log_probs(self, input_ids: torch.Tensor, labels: torch.Tensor,
                        attention_mask: torch.Tensor | None = None) -> torch.Tensor: ...


ForwardStep = Callable[[CausalLM, Batch], StepOutput]
# (the policy; the batch) -> the reference model's token log-probs
ReferenceLogProbs = Callable[[CausalLM, Batch], torch.Tensor]


def forward_language_model(model: CausalLM, batch: Batch) -> StepOutput:
    """Pretraining and SFT: cross entropy over the target tokens (labels != -100)."""
    output = model(batch["input_ids"], labels=batch["labels"],
                   attention_mask=batch.get("attention_mask"))
    return language_model_objective(output.loss, batch)


def language_model_objective(mean_loss: torch.Tensor, batch: Batch) -> StepOutput:
    """The micro-batch's share of the global batch's token mean, from its own mean (the
    model's loss, or a pipeline's last stage's): mean x its target tokens = its sum."""
    targets = (batch["labels"] != IGNORE_INDEX).sum()
    return share(mean_loss * targets, batch, TARGET_TOKENS), {}


def frozen_reference_log_probs(policy: torch.nn.Module, pair: Batch, *,
                               reference: torch.nn.Module) -> torch.Tensor:
    """The token log-probs of a separate, frozen reference model."""
    return reference.token_log_probs(**_model_inputs(pair))


@contextlib.contextmanager
def as_base_model(policy: torch.nn.Module) -> Iterator[None]:
    """Inside the block the LoRA policy (or its pipeline stage) is its frozen base: adapters
    off and eval mode, as a separate reference would be (no dropout)."""
    was_training = policy.training
    policy.eval()
    try:
        with adapters_disabled(policy):
            yield
    finally:
        policy.train(was_training)


def base_model_log_probs(policy: torch.nn.Module, pair: Batch) -> torch.Tensor:
    """LoRA's reference: the policy as its base (`as_base_model`)."""
    with as_base_model(policy):
        return policy.token_log_probs(**_model_inputs(pair))


@dataclass(frozen=True)
class DPOStep:
    """DPO: chosen and rejected go through the policy as one batch of 2B sequences (the
    collator pads both sides to one length).

    The two halves are separate methods because a pipeline computes them in different places
    (trainer/model_parallel.py): `with_reference` on every rank before the schedule runs,
    `objective` on the last stage, from the token log-probs it computed."""

    reference_log_probs: ReferenceLogProbs
    beta: float
    label_smoothing: float
    nll_weight: float

    def __call__(self, model: CausalLM, batch: Batch) -> StepOutput:
        pair = self.with_reference(model, batch)
        return self.objective(model.token_log_probs(**_model_inputs(pair)), pair)

    def with_reference(self, policy: CausalLM, batch: Batch) -> Batch:
        """The pair batch (input_ids, labels, attention_mask: chosen rows, then rejected) and
        `reference_logps` [2B], the frozen reference's log-probability of each answer."""
        pair = {key: torch.cat([batch[f"chosen_{key}"], batch[f"rejected_{key}"]])
                for key in ("input_ids", "labels", "attention_mask")}
        pair |= {key: batch[key] for key in (PAIRS, CHOSEN_TOKENS)}  # the global counts
        with torch.no_grad():
            pair["reference_logps"] = sequence_log_prob(self.reference_log_probs(policy, pair))
        return pair

    def objective(self, policy_token_logps: torch.Tensor, pair: Batch) -> StepOutput:
        """The DPO loss (+ RPO's NLL term) and its metrics from the policy's token log-probs
        [2B, S] of the pair batch: this micro-batch's share of the global batch's means (per
        pair; the NLL per chosen token)."""
        policy_logps = sequence_log_prob(policy_token_logps)
        reference_logps = pair["reference_logps"]
        half = policy_logps.shape[0] // 2
        out = dpo_loss(policy_logps[:half], policy_logps[half:], reference_logps[:half],
                       reference_logps[half:], beta=self.beta,
                       label_smoothing=self.label_smoothing)
        dpo_share = share(out.loss * half, pair, PAIRS)  # the batch's mean x its pairs
        chosen_nll = share(chosen_answer_nll_sum(policy_token_logps[:half], pair["labels"][:half]),
                           pair, CHOSEN_TOKENS)
        chosen, rejected = out.chosen_rewards, out.rejected_rewards
        per_pair = {"rewards/chosen": chosen, "rewards/rejected": rejected,
                    "rewards/accuracies": (chosen > rejected).float(),
                    "rewards/margins": chosen - rejected}
        return dpo_share + self.nll_weight * chosen_nll, {
            "dpo_loss": dpo_share.detach(), "chosen_nll": chosen_nll.detach(),
            **{name: share(values.sum(), pair, PAIRS) for name, values in per_pair.items()}}


def _model_inputs(pair: Batch) -> Batch:
    return {key: pair[key] for key in ("input_ids", "labels", "attention_mask")}


@dataclass(frozen=True)
class GRPOStep:
    """GRPO (trainer/grpo_loss.py) on a micro-batch of rollouts (trainer/rollouts.py): the
    answers' token log-probs under the policy, against those of the policy that sampled them
    (`old_logps`; the same weights when --grpo_iterations is 1, so they are this forward's,
    detached) and of the reference (`reference_logps`, when β > 0)."""

    epsilon_low: float
    epsilon_high: float
    beta: float
    loss_type: str
    max_completion_length: int

    def __call__(self, model: CausalLM, batch: Batch) -> StepOutput:
        policy_logps = model.token_log_probs(**_model_inputs(batch))
        old_logps = batch.get("old_logps", policy_logps.detach())
        terms = token_terms(policy_logps, old_logps, batch.get("reference_logps"),
                            batch["advantages"], epsilon_low=self.epsilon_low,
                            epsilon_high=self.epsilon_high, beta=self.beta)
        mask = (batch["labels"] != IGNORE_INDEX).float()
        count_key = COMPLETION_TOKENS if counted_by_tokens(self.loss_type) else COMPLETIONS
        loss = share(loss_sum(terms.loss, mask, self.loss_type, self.max_completion_length),
                     batch, count_key)
        per_token = {"kl": terms.kl, "clip_ratio/low": terms.low_clipped.float(),
                     "clip_ratio/high": terms.high_clipped.float()}
        return loss, {name: share((values.detach() * mask).sum(), batch, COMPLETION_TOKENS)
                      for name, values in per_token.items()}


def build_reference(init_from: str | None, device: torch.device, dtype_name: str,
                    lora: bool = False,
                    split_reference: Callable[[torch.nn.Module], Any] | None = None,
                    base_of_policy: Any | None = None) -> ReferenceLogProbs:
    """The frozen reference of DPO and GRPO: the model we started from, always `init_from`,
    never a copy of the policy (after a resume the policy has moved on); with `lora`, that
    model is the policy's frozen base. On a tensor/pipeline grid (anything with
    `token_log_probs`): `split_reference` cuts the reference like the policy, and with `lora`
    `base_of_policy` runs the policy's own stages as its base."""
    if lora and base_of_policy is not None:
        return functools.partial(frozen_reference_log_probs, reference=base_of_policy)
    if lora:
        return base_model_log_probs
    reference = load_model(init_from)[0].to(device, DTYPES[dtype_name]).eval()
    reference.requires_grad_(False)
    if split_reference is not None:
        reference = split_reference(reference)
    return functools.partial(frozen_reference_log_probs, reference=reference)


def build_forward_step(task_type: str, dpo: DPOOptions, grpo: GRPOOptions,
                       reference: Callable[[], ReferenceLogProbs]) -> ForwardStep:
    """The task's forward step; `reference()` builds the frozen reference if DPO needs it
    (GRPO's rollouts use it: trainer/rollouts.py)."""
    if task_type == "grpo":
        return GRPOStep(epsilon_low=grpo.grpo_epsilon,
                        epsilon_high=grpo.grpo_epsilon_high or grpo.grpo_epsilon,
                        beta=grpo.grpo_beta, loss_type=grpo.grpo_loss_type,
                        max_completion_length=grpo.max_completion_length)
    if task_type != "dpo":
        return forward_language_model
    return DPOStep(reference(), beta=dpo.dpo_beta, label_smoothing=dpo.dpo_label_smoothing,
                   nll_weight=dpo.dpo_nll_weight)
