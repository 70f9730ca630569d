"""Shared by the ZeRO tests: the small model, its data, and one training step for any stage."""

from __future__ import annotations

import contextlib

import torch

from optimizer import OptimizerConfig
from tests.model.model_helpers import VOCAB, small_model

MICRO_BATCHES, ROWS, SEQ = 2, 2, 8  # ROWS per micro-batch per rank


def make_optimizer_config() -> OptimizerConfig:
    return OptimizerConfig(lr=2e-3, weight_decay=0.1, clip_grad=0.5)


def new_model() -> torch.nn.Module:
    """Tied embeddings and activation checkpointing on: both must work at stage 3."""
    return small_model(seed=3, num_hidden_layers=3, tie_word_embeddings=True,
                       activation_checkpointing=True)


def batches(num_steps: int, world_size: int, seed: int = 7
            ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fresh random global batches; no ignored labels, so every micro-batch's mean loss weighs
    the same number of tokens and the mean of means is the whole-batch mean."""
    generator = torch.Generator().manual_seed(seed)
    rows = world_size * MICRO_BATCHES * ROWS
    return [(torch.randint(0, VOCAB, (rows, SEQ), generator=generator),
             torch.randint(0, VOCAB, (rows, SEQ), generator=generator))
            for _ in range(num_steps)]


def train_step(wrapped, optimizer, batch, rank: int, world_size: int) -> float:
    """This rank's share of one global batch, in MICRO_BATCHES micro-batches; the grad norm."""
    input_ids, labels = batch
    optimizer.zero_grad()
    micro = list(zip(input_ids.chunk(world_size)[rank].chunk(MICRO_BATCHES),
                     labels.chunk(world_size)[rank].chunk(MICRO_BATCHES)))
    for index, (ids, lab) in enumerate(micro):
        last = index == len(micro) - 1
        with contextlib.nullcontext() if last else wrapped.no_sync():
            (wrapped(ids, labels=lab).loss / MICRO_BATCHES).backward()
    wrapped.finish_grad_sync()
    stepped, norm = optimizer.step()
    assert stepped
    return norm


def as_numpy(value):
    """Tensors cross the process boundary as numpy arrays (a shared-memory tensor would need its
    sending rank alive while the test reads it)."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, dict):
        return {key: as_numpy(item) for key, item in value.items()}
    return value


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(abs(torch.as_tensor(a[k]) - torch.as_tensor(b[k])).max()) for k in a)
