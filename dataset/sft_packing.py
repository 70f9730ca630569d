"""Packing SFT samples: several short conversations end to end in one row, so that a step spends
its compute on tokens instead of padding.

A batch of `batch_size` samples is packed into as few rows of `max_seq_len` tokens as fit,
first-fit decreasing: the longest sample first, each into the first row with room. The
attention mask holds each token's sample number within its row (0 = padding), which the model
turns into positions that restart at every sample and a block-diagonal causal mask
(model/attention.py), so every sample is computed exactly as if it were alone in its row.
Worked example, max_seq_len 8, samples A (3 tokens), B (4), C (2), D (5):

    D -> row 0;  B -> row 1;  A -> row 0 (5 + 3 = 8 fits);  C -> row 1 (4 + 2 = 6)
    input_ids       D D D D D A A A      B B B B C C pad pad
    attention_mask  1 1 1 1 1 2 2 2      1 1 1 1 2 2  0   0
    position ids    0 1 2 3 4 0 1 2      0 1 2 3 0 1  0   0

Labels need no change: each sample's labels are already shifted and end in -100
(dataset/dataset_sft.py), so no sample is trained to predict the first token of the next one.
The loss is the mean over a batch's label tokens either way, so packing changes the cost of a
step, not what it learns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataset.dataset_sft import SFTCollator


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Rows of sample indices, each row's lengths summing to at most `capacity`."""
    rows: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[index] > capacity:
            raise ValueError(f"a sample of {lengths[index]} tokens does not fit in a packed row "
                             f"of {capacity}: raise --max_seq_len")
        row = next((r for r, free in enumerate(room) if free >= lengths[index]), len(rows))
        if row == len(rows):
            rows.append([])
            room.append(capacity)
        rows[row].append(index)
        room[row] -= lengths[index]
    return rows


@dataclass
class PackingSFTCollator(SFTCollator):
    """SFTCollator's interface; packs the items into rows of max_seq_len, then pads the rows."""

    def __call__(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if not self.max_seq_len:
            raise ValueError("packing needs max_seq_len: the length of a packed row")
        rows = first_fit_decreasing([len(item["input_ids"]) for item in items], self.max_seq_len)
        packed = [{"input_ids": torch.cat([items[i]["input_ids"] for i in row]),
                   "labels": torch.cat([items[i]["labels"] for i in row]),
                   "attention_mask": torch.cat([items[i]["attention_mask"] * number
                                                for number, i in enumerate(row, start=1)])}
                  for row in rows]
        length = self.batch_length([len(row["input_ids"]) for row in packed])
        return self.pad(packed, length)

