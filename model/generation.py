"""Autoregressive generation with a KV cache: greedy, temperature, top-k and top-p sampling.

Step 1 (prefill): run the whole (left-padded) prompt batch once, filling the KV cache, and
take the logits of the last position. Step 2 (decode): pick one token per row, feed just that
token, repeat. A row that produced `eos_token_id` (or one of them, given a list) is finished:
it keeps receiving `pad_token_id` (like HF) and generation stops when every row is finished.

The model's vocabulary is the tokenizer's rounded up (`Z2allConfig.vocab_size_multiple`); the
padding ids have embedding rows but no token, so they must never be sampled or ranked: with
`real_vocab_size` (the tokenizer's length) only the logits of ids below it are looked at.

`stream_generate` yields each step's tokens as they are made (generate.py prints them live);
`generate` collects them and returns prompt + new tokens like HF's `generate`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch


def left_align(input_ids: torch.Tensor, attention_mask: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Move every row's padding to the left (new tokens are appended on the right, so they
    must follow the last real token). A stable sort of the mask puts 0s first and keeps the
    real tokens' order:  [A B C pad] -> [pad A B C]."""
    if attention_mask is None:
        return input_ids, None
    order = torch.sort(attention_mask, dim=1, stable=True).indices
    return input_ids.gather(1, order), attention_mask.gather(1, order)


def sample_next_token(logits: torch.Tensor, temperature: float, top_k: int | None,
                      top_p: float | None, generator: torch.Generator | None,
                      real_vocab_size: int | None = None) -> torch.Tensor:
    """One token id per row from fp32 logits [B, V]; temperature 0 means greedy (argmax).
    Ids >= `real_vocab_size` (the model's padding rows) are never chosen."""
    logits = logits[:, :real_vocab_size]
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    # Shift the best logit to 0 first: a tiny temperature (1e-40) then sends the others to
    # -inf (sampling becomes greedy) instead of turning +-inf / inf into NaN probabilities.
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None:
        kth_largest = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p is not None and top_p < 1.0:
        # Nucleus sampling (Holtzman et al. 2019): keep the most likely tokens until their
        # total probability reaches top_p. A token is dropped if the tokens ranked above it
        # already hold more than top_p (so the most likely token is always kept).
        sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop = torch.zeros_like(logits, dtype=torch.bool).scatter(1, sorted_ids,
                                                                 mass_above > top_p)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]


class GenerationMixin:
    """Needs `new_kv_cache(batch, capacity)` and `next_token_logits(ids, mask, cache)`."""

    @torch.no_grad()
    def stream_generate(self, input_ids: torch.Tensor, max_new_tokens: int,
                        temperature: float = 0.0, top_k: int | None = None,
                        top_p: float | None = None,
                        eos_token_id: int | Sequence[int] | None = None,
                        attention_mask: torch.Tensor | None = None,
                        pad_token_id: int | None = None,
                        generator: torch.Generator | None = None,
                        cache_capacity: int | None = None,
                        real_vocab_size: int | None = None) -> Iterator[torch.Tensor]:
        """Yield the new token of every row, [B], once per step. Padded prompts must come
        with `attention_mask` (either padding side); see `generate` for the arguments."""
        input_ids, attention_mask = left_align(input_ids, attention_mask)
        stop_ids = torch.tensor([] if eos_token_id is None else eos_token_id,
                                dtype=torch.long, device=input_ids.device).reshape(-1)
        if pad_token_id is None and len(stop_ids):
            pad_token_id = int(stop_ids[0])
        batch_size, prompt_len = input_ids.shape
        kv_cache = self.new_kv_cache(batch_size, cache_capacity or prompt_len + max_new_tokens)
        finished = torch.zeros(batch_size, dtype=torch.bool, device=input_ids.device)
        new_input, key_padding_mask = input_ids, attention_mask
        for _ in range(max_new_tokens):
            logits = self.next_token_logits(new_input, key_padding_mask, kv_cache)
            next_token = sample_next_token(logits, temperature, top_k, top_p, generator,
                                           real_vocab_size)
            if len(stop_ids):
                next_token = next_token.masked_fill(finished, pad_token_id)
                finished |= torch.isin(next_token, stop_ids)
            yield next_token
            if bool(finished.all()):
                return
            new_input = next_token[:, None]
            if key_padding_mask is not None:
                key_padding_mask = torch.cat([key_padding_mask,
                                              key_padding_mask.new_ones(batch_size, 1)], dim=1)

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None,
                 eos_token_id: int | Sequence[int] | None = None,
                 attention_mask: torch.Tensor | None = None,
                 pad_token_id: int | None = None, generator: torch.Generator | None = None,
                 cache_capacity: int | None = None,
                 real_vocab_size: int | None = None) -> torch.Tensor:
        """Prompt + up to `max_new_tokens` new tokens, [B, T + n] (the prompt left-aligned if
        it was right-padded). temperature 0 = greedy; top_k / top_p filter before sampling;
        rows stop at `eos_token_id` (an id or a list) and are then filled with `pad_token_id`
        (default: the first eos id);
        `generator` makes sampling reproducible; `cache_capacity` is the KV cache's initial
        size (it grows as needed); `real_vocab_size` (the tokenizer's length) keeps the
        model's padding ids out of the output."""
        prompt, _ = left_align(input_ids, attention_mask)
        new_tokens = list(self.stream_generate(
            input_ids, max_new_tokens, temperature, top_k, top_p, eos_token_id, attention_mask,
            pad_token_id, generator, cache_capacity, real_vocab_size))
        if not new_tokens:
            return prompt
        return torch.cat([prompt, torch.stack(new_tokens, dim=1)], dim=1)
