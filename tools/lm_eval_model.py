"""Our model + tokenizer as an lm-evaluation-harness model, so lm-eval's tasks run on z2all.

lm-eval asks a model three kinds of questions (lm_eval.api.model.LM):

    loglikelihood(context, continuation)  -> (log P(continuation | context), was it greedy?)
    loglikelihood_rolling(text)            -> log P(text), over windows of the model's length
    generate_until(context, gen_kwargs)    -> greedy text, cut at the first `until` string

How a context becomes tokens depends on the model: a chat model (SFT/DPO) gets the context as a
user turn of its chat template followed by the assistant header, exactly as tools.demo_eval,
generate.py and the server prompt it, and its reply ends at `<|im_end|>`; a base model gets the
context's plain tokens and ends at EOS. A continuation is always its plain tokens.

Batching: requests are scored `batch_size` at a time, right-padded with an attention mask (the
model gives padded and unpadded rows the same logits for the real tokens).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from trainer.evaluation import generate_samples
from utils.conversation import build_generation_prompt
from utils.tokenizer_protocol import Tokenizer


class Z2allLM(LM):
    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, chat: bool, max_length: int,
                 batch_size: int = 16, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.model, self.tokenizer, self.chat = model, tokenizer, chat
        self.max_length, self.batch_size = max_length, batch_size
        self._device = torch.device(device)  # LM.device (a property) reads it

    def context_ids(self, context: str) -> list[int]:
        if self.chat:
            return build_generation_prompt(self.tokenizer, [{"role": "user", "content": context}])
        return self.tokenizer.encode(context, add_special_tokens=False)

    @torch.no_grad()
    def score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of log-probs, all greedy?) of each continuation after its context; a pair longer
        than max_length + 1 tokens keeps its last max_length + 1."""
        results = []
        for start in tqdm(range(0, len(pairs), self.batch_size), desc="loglikelihood",
                          unit="batch", disable=len(pairs) <= self.batch_size):
            chunk = []  # (ids, how many of the last ones are scored)
            for context, continuation in pairs[start:start + self.batch_size]:
                ids = (context + continuation)[-(self.max_length + 1):]
                chunk.append((ids, min(len(continuation), len(ids) - 1)))
            width = max(len(ids) - 1 for ids, _ in chunk)
            inputs = torch.tensor([ids[:-1] + [0] * (width - len(ids) + 1) for ids, _ in chunk],
                                  device=self.device)
            mask = torch.tensor([[1] * (len(ids) - 1) + [0] * (width - len(ids) + 1)
                                 for ids, _ in chunk], device=self.device)
            log_probs = F.log_softmax(self.model(inputs, attention_mask=mask).logits.float(), -1)
            for row, (ids, num_scored) in enumerate(chunk):
                positions = torch.arange(len(ids) - 1 - num_scored, len(ids) - 1,
                                         device=self.device)
                targets = torch.tensor(ids[len(ids) - num_scored:], device=self.device)
                row_log_probs = log_probs[row, positions]
                results.append((float(row_log_probs.gather(1, targets[:, None]).sum()),
                                bool((row_log_probs.argmax(-1) == targets).all())))
        return results

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        return self.score([(self.context_ids(context),
                            self.tokenizer.encode(continuation, add_special_tokens=False))
                           for context, continuation in (request.args for request in requests)])

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        totals = []
        for (text,) in (request.args for request in requests):
            windows = [make_disjoint_window(window) for window in get_rolling_token_windows(
                self.tokenizer.encode(text, add_special_tokens=False),
                prefix_token=self.tokenizer.eos_token_id, max_seq_len=self.max_length,
                context_len=1)]
            totals.append(sum(log_prob for log_prob, _ in self.score(windows)))
        return totals

    def generate_until(self, requests: list[Any]) -> list[str]:
        """Greedy replies; requests sharing generation settings are generated in one batch run."""
        replies: list[str | None] = [None] * len(requests)
        groups: dict[tuple[int, tuple[str, ...]], list[int]] = {}
        for index, request in enumerate(requests):
            context, gen_kwargs = request.args
            if gen_kwargs.get("do_sample") or gen_kwargs.get("temperature", 0.0) > 0:
                raise ValueError("z2all's lm-eval model generates greedily: the task asks for "
                                 "sampling (do_sample/temperature); drop it from the task")
            until = gen_kwargs.get("until") or []
            key = (int(gen_kwargs.get("max_gen_toks", 256)),
                   (until,) if isinstance(until, str) else tuple(until))
            groups.setdefault(key, []).append(index)
        for (max_new_tokens, until), indices in groups.items():
            samples = generate_samples(self.model, self.tokenizer,
                                       [requests[i].args[0] for i in indices], chat=self.chat,
                                       max_new_tokens=max_new_tokens, device=self.device,
                                       batch_size=self.batch_size)
            for index, sample in zip(indices, samples):
                replies[index] = _cut_at_first(sample["completion"], until)
        return replies


def _cut_at_first(text: str, stops: tuple[str, ...]) -> str:
    """`text` up to the earliest of the stop strings (lm-eval's `until`)."""
    cut = min((text.index(stop) for stop in stops if stop and stop in text), default=len(text))
    return text[:cut]
