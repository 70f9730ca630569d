"""Small random models shared by the model tests (tiny shapes: every test runs in seconds)."""

from __future__ import annotations

import torch

from model.configuration_z2all import Z2allConfig
from model.modeling_z2all import Z2allForCausalLM

VOCAB = 256
# query heads / key-value heads for the three attention flavours
ATTENTION_KINDS = {"mha": (4, 4), "gqa": (4, 2), "mqa": (4, 1)}


def small_config(kind: str = "gqa", **overrides) -> Z2allConfig:
    heads, kv_heads = ATTENTION_KINDS[kind]
    # initializer_range 0.1: logits spread enough that greedy decoding has no near-ties.
    values = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=heads, num_key_value_heads=kv_heads,
                  intermediate_size=96, max_position_embeddings=64, rope_theta=500.0,
                  initializer_range=0.1)
    return Z2allConfig(**{**values, **overrides})


def small_model(kind: str = "gqa", seed: int = 0, **overrides) -> Z2allForCausalLM:
    torch.manual_seed(seed)
    return Z2allForCausalLM(small_config(kind, **overrides))


def random_batch(batch_size: int, seq_len: int, seed: int = 1) -> tuple[torch.Tensor, ...]:
    """(input_ids, labels) with a few labels set to -100."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (batch_size, seq_len), generator=generator)
    labels = torch.randint(0, VOCAB, (batch_size, seq_len), generator=generator)
    ignored = torch.rand(batch_size, seq_len, generator=generator) < 0.25
    return input_ids, labels.masked_fill(ignored, -100)


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[[5, 6], [7, 8, 9]] -> ids [[pad, 5, 6], [7, 8, 9]], mask [[0, 1, 1], [1, 1, 1]]."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask
