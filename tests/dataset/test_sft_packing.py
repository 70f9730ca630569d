"""SFT packing (dataset/sft_packing.py + the sample-numbered mask in model/attention.py): packed
samples are computed exactly as unpacked ones, and no attention crosses a sample boundary."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dataset.dataset_sft import SFTCollator, chat_item
from dataset.sft_packing import PackingSFTCollator, first_fit_decreasing
from model.attention import attention_mask_for, packed_tokens_for, position_ids_for
from tests.model.model_helpers import VOCAB, small_model
from utils.labels import IGNORE_INDEX

PAD = 0
ATOL = 1e-5


def _items(lengths: list[int], seed: int = 3) -> list[dict[str, torch.Tensor]]:
    """Chat-like samples: a prompt without loss, then a reply with loss (labels shifted)."""
    rng = np.random.default_rng(seed)
    items = []
    for length in lengths:
        ids = rng.integers(1, VOCAB, length)
        loss_mask = (np.arange(length) >= length // 2).astype(np.int64)
        items.append(chat_item(ids, loss_mask))
    return items


def test_first_fit_decreasing_follows_the_worked_example():
    """The module docstring's example: A 3, B 4, C 2, D 5 tokens into rows of 8."""
    assert first_fit_decreasing([3, 4, 2, 5], capacity=8) == [[3, 0], [1, 2]]
    with pytest.raises(ValueError, match="raise --max_seq_len"):
        first_fit_decreasing([3, 9], capacity=8)


def test_packed_batch_layout():
    items = _items([3, 4, 2, 5])
    batch = PackingSFTCollator(PAD, pad_to_multiple_of=1, max_seq_len=8)(items)
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 2, 2, 2],
                                                [1, 1, 1, 1, 2, 2, 0, 0]]
    assert batch["input_ids"][0].tolist() == items[3]["input_ids"].tolist() + \
        items[0]["input_ids"].tolist()
    assert batch["labels"][1, 6:].tolist() == [IGNORE_INDEX] * 2
    # each sample's last label is -100: nothing is trained across a boundary
    assert batch["labels"][0, 4].item() == IGNORE_INDEX
    positions = position_ids_for(batch["attention_mask"], 8, 0, torch.device("cpu"))
    assert positions.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 0, 1, 0, 0]]


def test_attention_never_crosses_a_sample_boundary():
    """Every allowed (query, key) pair is causal and inside one sample (or a pad on itself)."""
    mask = torch.tensor([[1, 1, 1, 2, 2, 3, 0], [1, 1, 1, 1, 2, 2, 2]])
    allowed, _ = attention_mask_for(mask, 7, 0, torch.device("cpu"))
    for row in range(mask.shape[0]):
        for query in range(7):
            for key in range(7):
                same = mask[row, query] == mask[row, key] and mask[row, key] > 0
                expected = key <= query and (same or key == query)
                assert allowed[row, 0, query, key].item() == expected, (row, query, key)


def test_flash_varlen_sees_one_sequence_per_packed_sample():
    """cu_seqlens: (row 0, sample 1) 2 tokens, (0, 2) 3, (1, 1) 3, (1, 2) none."""
    packed = packed_tokens_for(torch.tensor([[1, 1, 2, 2, 2, 0], [1, 1, 1, 0, 0, 0]]), 6)
    assert packed.cu_seqlens_q.tolist() == packed.cu_seqlens_k.tolist() == [0, 2, 5, 8, 8]
    assert packed.max_seqlen_q == 3 and packed.query_cols.tolist() == [0, 1, 2, 3, 4, 0, 1, 2]


def test_changing_one_sample_leaves_the_others_unchanged():
    """The behaviour, not the mask: other samples' logits do not move (to the last bit)."""
    model = small_model("gqa").eval()
    items = _items([5, 7, 4, 6])
    collator = PackingSFTCollator(PAD, pad_to_multiple_of=1, max_seq_len=12)
    batch = collator(items)
    changed = [dict(item) for item in items]
    changed[1] = {**items[1], "input_ids": (items[1]["input_ids"] + 1) % VOCAB}
    changed_batch = collator(changed)
    with torch.no_grad():
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        changed_logits = model(changed_batch["input_ids"],
                               attention_mask=changed_batch["attention_mask"]).logits
    moved = changed_batch["input_ids"] != batch["input_ids"]
    row = int(moved.nonzero()[0, 0])
    sample = changed_batch["attention_mask"][row][moved[row]].unique().item()
    others = (changed_batch["attention_mask"] != sample) | (torch.arange(2)[:, None] != row)
    others &= changed_batch["attention_mask"] > 0
    assert torch.equal(logits[others], changed_logits[others])
    assert not torch.allclose(logits[~others & (batch["attention_mask"] > 0)],
                              changed_logits[~others & (batch["attention_mask"] > 0)])


def _per_sample_nll(model, batch: dict[str, torch.Tensor], samples: int) -> torch.Tensor:
    """Summed NLL of each sample's label tokens, in the order samples appear in the batch."""
    log_probs = model.token_log_probs(batch["input_ids"], batch["labels"],
                                      batch["attention_mask"])
    sums = []
    for row in range(batch["input_ids"].shape[0]):
        for number in batch["attention_mask"][row].unique().tolist():
            if number > 0:
                sums.append(-log_probs[row][batch["attention_mask"][row] == number].sum())
    assert len(sums) == samples
    return torch.stack(sums)


def test_packed_and_unpacked_give_the_same_losses_and_gradients():
    """fp32: each sample's loss alone in its row vs packed; the batch loss and every gradient."""
    torch.manual_seed(0)
    model = small_model("gqa")
    items = _items([9, 14, 5, 11, 7, 16, 6, 12], seed=5)
    packed = PackingSFTCollator(PAD, pad_to_multiple_of=8, max_seq_len=32)(items)
    padded = SFTCollator(PAD, pad_to_multiple_of=8, max_seq_len=32)(items)
    assert packed["input_ids"].numel() < padded["input_ids"].numel()

    order = first_fit_decreasing([len(item["input_ids"]) for item in items], 32)
    alone = torch.stack([_per_sample_nll(model, SFTCollator(PAD)([items[i]]), 1)[0]
                         for row in order for i in row])
    assert torch.allclose(_per_sample_nll(model, packed, len(items)), alone, atol=ATOL)

    def loss_and_grads(batch):
        model.zero_grad(set_to_none=True)
        loss = model(batch["input_ids"], labels=batch["labels"],
                     attention_mask=batch["attention_mask"]).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    packed_loss, packed_grads = loss_and_grads(packed)
    padded_loss, padded_grads = loss_and_grads(padded)
    assert torch.allclose(packed_loss, padded_loss, atol=ATOL)
    for packed_grad, padded_grad in zip(packed_grads, padded_grads):
        assert torch.allclose(packed_grad, padded_grad, atol=ATOL)
