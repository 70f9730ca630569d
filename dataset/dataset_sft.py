r"""Supervised fine-tuning samples: a ChatML conversation with labels only on assistant replies.

    item = SupervisedDataset(store)[i]
    item["input_ids"]       int64[T]   the rendered conversation (utils/conversation.py)
    item["labels"]          int64[T]   labels[t] = input_ids[t+1] if mask[t+1] else -100; last -100
    item["attention_mask"]  int64[T]   ones (padding adds zeros in the collator)

Labels are already shifted (design.md §5): the model compares logits[t] with labels[t] directly.
Worked example (S/E = <|im_start|>/<|im_end|>, a = assistant tokens, - = -100):

    t          0   1       2   3   4   5   6            7   8   9   10
    input_ids  S   user\n  Hi  E   \n  S   assistant\n  a1  a2  E   \n
    mask       0   0       0   0   0   0   0            1   1   1   0
    labels     -   -       -   -   -   -   a1           a2  E   -   -

The samples come either from `python -m data_preprocess.pretokenize_sft_data` or from the cache
that dataset/build.py builds online from raw files; both are a ChatTokenStore.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dataset.chat_store import ChatSamples
from utils.labels import IGNORE_INDEX


def shifted_labels(ids: np.ndarray, loss_mask: np.ndarray) -> torch.Tensor:
    """labels[t] = ids[t + 1] where loss_mask[t + 1] is 1, else -100; the last one is -100."""
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
    labels[:-1] = np.where(loss_mask[1:] == 1, ids[1:].astype(np.int64), IGNORE_INDEX)
    return torch.from_numpy(labels)


def chat_item(ids: np.ndarray, loss_mask: np.ndarray) -> dict[str, torch.Tensor]:
    input_ids = torch.from_numpy(ids.astype(np.int64))
    return {"input_ids": input_ids, "labels": shifted_labels(ids, loss_mask),
            "attention_mask": torch.ones_like(input_ids)}


class SupervisedDataset(ChatSamples):
    """SFT samples of a store (a path or a ChatTokenStore), optionally one split of it."""

    kind = "sft"

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ((ids, loss_mask),) = self.sequences(index)
        return chat_item(ids, loss_mask)


def padded_length(longest: int, pad_to_multiple_of: int, max_seq_len: int | None) -> int:
    """Round up to a multiple (tensor cores like multiples of 8) without exceeding max_seq_len."""
    length = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    return min(length, max(max_seq_len, longest)) if max_seq_len else length


def pad_right(tensors: list[torch.Tensor], length: int, value: int) -> torch.Tensor:
    batch = torch.full((len(tensors), length), value, dtype=torch.int64)
    for row, tensor in enumerate(tensors):
        batch[row, : len(tensor)] = tensor
    return batch


@dataclass
class SFTCollator:
    """Pad a list of items on the right: ids with pad_token_id, labels -100, attention mask 0."""

    pad_token_id: int
    pad_to_multiple_of: int = 8
    max_seq_len: int | None = None

    def pad(self, items: list[dict[str, torch.Tensor]], length: int,
            prefix: str = "") -> dict[str, torch.Tensor]:
        def column(name: str) -> list[torch.Tensor]:
            return [item[prefix + name] for item in items]

        return {prefix + "input_ids": pad_right(column("input_ids"), length, self.pad_token_id),
                prefix + "labels": pad_right(column("labels"), length, IGNORE_INDEX),
                prefix + "attention_mask": pad_right(column("attention_mask"), length, 0)}

    def batch_length(self, lengths: list[int]) -> int:
        return padded_length(max(lengths), self.pad_to_multiple_of, self.max_seq_len)

    def __call__(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        length = self.batch_length([len(item["input_ids"]) for item in items])
        return self.pad(items, length)
