"""DPO preference pairs: the same prompt followed by a chosen and a rejected reply.

    item = DPODataset(store)[i]
    item["chosen_input_ids"], item["chosen_labels"], item["chosen_attention_mask"]
    item["rejected_input_ids"], item["rejected_labels"], item["rejected_attention_mask"]

Each side is rendered like an SFT sample (utils/conversation.py): labels are shifted and -100
everywhere except the reply and its `<|im_end|>`, so summing the model's `token_log_probs`
over a side gives log p(reply | prompt), the quantity the DPO loss compares (trainer/dpo_loss.py).
In the store a pair is one document of two sequences: (prompt + chosen, prompt + rejected).
"""

from __future__ import annotations

import torch

from dataset.chat_store import ChatSamples
from dataset.dataset_sft import SFTCollator, chat_item


class DPODataset(ChatSamples):
    """Preference pairs of a store (a path or a ChatTokenStore), optionally one split of it."""

    kind = "dpo"

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        chosen, rejected = self.sequences(index)
        item = {}
        for side, (ids, loss_mask) in (("chosen_", chosen), ("rejected_", rejected)):
            item.update({side + key: value for key, value in chat_item(ids, loss_mask).items()})
        return item


class DPOCollator(SFTCollator):
    """Pad both sides to one common length, so a trainer can concatenate them into one batch."""

    def __call__(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        length = self.batch_length([len(item[side + "input_ids"]) for item in items
                                    for side in ("chosen_", "rejected_")])
        return {**self.pad(items, length, "chosen_"), **self.pad(items, length, "rejected_")}
