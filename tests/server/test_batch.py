"""The running batch (server/batch.py): rows that join, decode and leave one shared KV cache
compute the same next-token logits as each sequence run alone through a plain forward."""

from __future__ import annotations

import random

import torch

from server.batch import DecodeBatch
from tests.model.model_helpers import VOCAB, small_model


def solo_logits(model, sequence: list[int]) -> torch.Tensor:
    """Reference: no cache, no padding, the whole sequence in one forward."""
    return model(torch.tensor([sequence])).logits[0, -1].float()


def check_rows(model, batch: DecodeBatch, logits: torch.Tensor, sequences) -> None:
    assert logits.shape[0] == batch.size == len(sequences)
    assert bool(batch.key_padding_mask[:, 0].any())  # no all-padding slot on the left
    for row, sequence in enumerate(sequences):
        torch.testing.assert_close(logits[row], solo_logits(model, sequence),
                                   atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_rows_joining_and_leaving_decode_like_solo_sequences():
    model = small_model("gqa").eval()
    rng = random.Random(0)

    def prompts(lengths):
        return [[rng.randrange(VOCAB) for _ in range(n)] for n in lengths]

    def step(batch, logits, sequences):
        tokens = logits.argmax(-1)
        for sequence, token in zip(sequences, tokens.tolist()):
            sequence.append(token)
        return batch.decode(model, tokens)

    sequences = prompts([3, 9, 5])
    batch, logits = DecodeBatch.prefill(model, sequences)
    check_rows(model, batch, logits, sequences)
    for _ in range(3):
        logits = step(batch, logits, sequences)
        check_rows(model, batch, logits, sequences)
    # Two newcomers: one longer than the running rows (they get padded), one shorter.
    newcomers = prompts([20, 2])
    group, new_logits = DecodeBatch.prefill(model, newcomers)
    batch.join(group)
    sequences += newcomers
    logits = torch.cat([logits, new_logits])
    check_rows(model, batch, logits, sequences)
    logits = step(batch, logits, sequences)
    # The long newcomer leaves: the padding only it needed is cut away.
    width_before = batch.length
    keep = [0, 1, 2, 4]
    batch.keep(keep)
    sequences = [sequences[i] for i in keep]
    logits = logits[keep]
    assert batch.length < width_before
    check_rows(model, batch, logits, sequences)
    for _ in range(2):
        logits = step(batch, logits, sequences)
        check_rows(model, batch, logits, sequences)
