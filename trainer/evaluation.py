"""Validation during training: a fixed set of held-out batches, and greedy sample generations.

The evaluation set is the same at every evaluation (evenly spaced samples of the valid split,
split over ranks), so successive val losses are comparable and independent of where training
is in its data order. Nothing here touches a random generator: evaluating (or not) between two
steps cannot change training, which keeps resumed runs bitwise identical.

Bits per byte makes runs with different tokenizers comparable: the summed loss in nats over the
target tokens, divided by ln 2 times the UTF-8 bytes those targets decode to
(bpb = Σ nll / (ln 2 · bytes); the tokenizer-free yardstick of e.g. the Pile / GPT-NeoX papers).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from trainer.distributed_env import DistributedEnv, all_reduce_sum
from trainer.forward_steps import CausalLM
from trainer.global_batch import attach_per_replica, global_counts
from trainer.options import EvalOptions
from utils.conversation import build_generation_prompt, stop_ids
from utils.labels import IGNORE_INDEX
from utils.tokenizer_protocol import Tokenizer


def fixed_eval_indices(num_samples: int, num_wanted: int, env: DistributedEnv) -> list[int]:
    """This rank's share of `num_wanted` samples spread evenly over the valid split.

    Example: 10 samples, 4 wanted, 2 ranks -> positions [0, 2, 5, 7]; rank 0 [0, 5], rank 1
    [2, 7].
    """
    total = min(num_samples, num_wanted)
    positions = [i * num_samples // total for i in range(total)]
    return positions[env.rank::env.world_size]


def eval_loader(dataset: Dataset, collate_fn: Callable, batch_size: int, eval_samples: int,
                env: DistributedEnv) -> DataLoader:
    """This rank's share of `eval_samples` fixed samples, in batches of `batch_size`."""
    indices = fixed_eval_indices(len(dataset), eval_samples, env)
    # Its own generator: each `iter(loader)` draws a seed, and drawing it from the global
    # generator would make evaluating change the training run's dropout stream.
    return DataLoader(Subset(dataset, indices), batch_size=batch_size, shuffle=False,
                      collate_fn=collate_fn, generator=torch.Generator().manual_seed(0))


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}


def batches_on_every_rank(loader: Iterable[dict[str, torch.Tensor]], env: DistributedEnv
                          ) -> Iterator[tuple[dict[str, torch.Tensor], bool]]:
    """(batch on the device, whether it counts) for this rank's share of the valid split, then
    uncounted one-sample batches until it has run as many forwards as the rank with the longest
    share. ZeRO-3's forward all-gathers each block's shards with the other ranks, so a rank
    whose share of a small valid split ran out (1 sample over 2 ranks: rank 1 has none) would
    leave them waiting in that gather. The shares are counted first (`len(loader)`: an
    `eval_loader`), since no rank may enter another collective while others still run forwards;
    one process takes any iterable of batches."""
    if not env.is_distributed:
        yield from ((to_device(batch, env.device), True) for batch in loader)
        return
    mine = len(loader)
    shares = all_reduce_sum([float(mine if rank == env.rank else 0)
                             for rank in range(env.world_size)], env)
    for batch in loader:
        yield to_device(batch, env.device), True
    if max(shares) > mine:  # some rank has samples, so the valid split is not empty
        filler = loader.collate_fn([loader.dataset.dataset[0]])  # (the Subset's dataset)
        for _ in range(int(max(shares)) - mine):
            yield to_device(filler, env.device), False


@torch.no_grad()
def evaluate_language_model(model: CausalLM, loader: DataLoader, tokenizer: Tokenizer,
                            env: DistributedEnv, counted: bool = True) -> dict[str, float]:
    """val_loss (nats/token), val_ppl and val_bpb over the fixed eval set, all ranks together.
    `counted=False`: this rank's batches are copies of another rank's (a tensor/pipeline grid),
    run for the collective forward but not added."""
    nll_sum = token_count = byte_count = 0.0
    for batch, counts in batches_on_every_rank(loader, env):
        labels = batch["labels"]
        output = model(batch["input_ids"], labels=labels,
                       attention_mask=batch.get("attention_mask"))
        if not counts:
            continue
        targets = labels != IGNORE_INDEX
        num_targets = int(targets.sum())
        nll_sum += output.loss.float().item() * num_targets  # loss is the mean over targets
        token_count += num_targets
        for row, keep in zip(labels.tolist(), targets.tolist()):
            text = tokenizer.decode([t for t, k in zip(row, keep) if k])
            byte_count += len(text.encode("utf-8"))
    sums = [nll_sum, token_count, byte_count] if counted else [0.0, 0.0, 0.0]
    nll_sum, token_count, byte_count = all_reduce_sum(sums, env)
    val_loss = nll_sum / token_count if token_count else math.nan  # no data: no figure
    return {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 50.0)),
            "val_bpb": nll_sum / (math.log(2) * max(byte_count, 1)), "val_tokens": token_count}


@torch.no_grad()
def evaluate_with_forward_step(forward_step: Callable, loader: DataLoader, env: DistributedEnv,
                               counted: bool = True) -> dict[str, float]:
    """A forward step's loss and metrics over the whole fixed eval set (used for DPO pairs):
    each batch carries the set's counts (pairs, chosen tokens: trainer/global_batch.py), so
    its shares, summed over batches and ranks, are the set's means. `counted` as in
    `evaluate_language_model`."""
    totals = global_counts(loader, counted, env)  # (collates the small eval set twice)
    sums: dict[str, float] = {}
    for batch, counts in batches_on_every_rank(loader, env):
        attach_per_replica([batch], totals, replicas=1)
        loss, extras = forward_step(batch)
        for key, value in {"loss": loss, **extras}.items():  # every rank: the same keys
            sums[key] = sums.get(key, 0.0) + (float(value) if counts and counted else 0.0)
    keys = sorted(sums)
    return {f"val_{key}": total
            for key, total in zip(keys, all_reduce_sum([sums[key] for key in keys], env))}


@torch.no_grad()
def generate_samples(model: Any, tokenizer: Tokenizer, prompts: list[str], chat: bool,
                     max_new_tokens: int, device: torch.device,
                     batch_size: int = 64) -> list[dict[str, str]]:
    """Greedy completions of `prompts` (as a user turn of the chat template for sft/dpo
    models), `batch_size` prompts at a time (right-padded, with an attention mask). Each
    stops at one of the tokenizer's stop ids (utils/conversation.py)."""
    stops = stop_ids(tokenizer)
    samples = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        encoded = [build_generation_prompt(tokenizer, [{"role": "user", "content": p}]) if chat
                   else tokenizer.encode(p, add_special_tokens=False) for p in chunk]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.tensor([ids + [stops[0]] * (width - len(ids)) for ids in encoded],
                                 device=device)
        attention_mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids))
                                       for ids in encoded], device=device)
        output = model.generate(input_ids, max_new_tokens=max_new_tokens, temperature=0.0,
                                eos_token_id=stops, attention_mask=attention_mask,
                                real_vocab_size=len(tokenizer))
        for prompt, row in zip(chunk, output[:, width:].tolist()):
            ends = [index for index, token in enumerate(row) if token in stops]
            new_ids = row[:ends[0]] if ends else row
            samples.append({"prompt": prompt, "completion": tokenizer.decode(new_ids)})
    return samples


class Evaluator:
    """One evaluation as the loop runs it: the fixed validation set through the task's metric
    (language models: loss, perplexity, bits per byte; DPO: its forward step's loss and
    rewards), then greedy samples of the eval prompts on rank 0."""

    def __init__(self, valid_loader: DataLoader, tokenizer: Tokenizer, forward_step: Callable,
                 task_type: str, eval_options: EvalOptions, env: DistributedEnv,
                 counts_data: bool = True) -> None:
        self.valid_loader, self.tokenizer, self.counts_data = valid_loader, tokenizer, counts_data
        self.forward_step, self.task_type = forward_step, task_type
        self.options, self.env = eval_options, env

    def __call__(self, scored: CausalLM, model: Any,
                 whole_model: Callable[[], AbstractContextManager] | None = None
                 ) -> tuple[dict[str, float], list[dict[str, str]]]:
        """(metrics, samples); leaves the model in train mode. `scored` is what computes the
        loss (trainer/parallelize.py `eval_model`), `whole_model()` (entered by every rank)
        what rank 0 generates samples from (default: `model` itself)."""
        model.eval()
        if self.task_type == "dpo":
            metrics = evaluate_with_forward_step(functools.partial(self.forward_step, scored),
                                                 self.valid_loader, self.env,
                                                 counted=self.counts_data)
        else:
            metrics = evaluate_language_model(scored, self.valid_loader, self.tokenizer, self.env,
                                              counted=self.counts_data)
        samples = []
        if self.options.eval_prompts:
            with (whole_model or functools.partial(contextlib.nullcontext, model))() as whole:
                if self.env.is_main:
                    samples = generate_samples(whole, self.tokenizer, self.options.eval_prompts,
                                               chat=self.task_type != "pretrain",
                                               max_new_tokens=self.options.max_new_tokens,
                                               device=self.env.device)
        model.train()
        return metrics, samples
