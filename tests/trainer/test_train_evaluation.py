"""Evaluation: the fixed eval set, and val loss / bits per byte vs an independent computation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from model.configuration_z2all import Z2allConfig
from model.modeling_z2all import Z2allForCausalLM
from trainer.distributed_env import DistributedEnv
from trainer.evaluation import (
    eval_loader,
    evaluate_language_model,
    evaluate_with_forward_step,
    fixed_eval_indices,
)
from trainer.global_batch import PAIRS


def _env(rank=0, world_size=1):
    return DistributedEnv(rank, world_size, rank, world_size, torch.device("cpu"))


@pytest.mark.parametrize("num_samples, wanted, world_size", [(10, 4, 2), (97, 40, 4), (5, 50, 2)])
def test_fixed_eval_indices_are_spread_disjoint_and_complete(num_samples, wanted, world_size):
    shares = [fixed_eval_indices(num_samples, wanted, _env(r, world_size))
              for r in range(world_size)]
    union = sorted(i for share in shares for i in share)
    assert len(union) == len(set(union)) == min(num_samples, wanted)  # disjoint, right size
    assert union[0] == 0 and all(0 <= i < num_samples for i in union)
    if wanted < num_samples:  # spread over the split, not its first samples
        assert union[-1] >= num_samples - num_samples // wanted - 1
    assert shares == [fixed_eval_indices(num_samples, wanted, _env(r, world_size))
                      for r in range(world_size)]  # the same set every time


class ByteTokenizer:
    """Token t decodes to (t % 3 + 1) UTF-8 bytes: 'a', 'é' or '€'."""

    def decode(self, ids):
        return "".join("aé€"[t % 3] for t in ids)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, length, vocab):
        gen = torch.Generator().manual_seed(5)
        self.ids = torch.randint(0, vocab, (n, length + 1), generator=gen)
        self.ignore = torch.rand(n, length, generator=gen) < 0.3

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        labels = self.ids[i, 1:].masked_fill(self.ignore[i], -100)
        return {"input_ids": self.ids[i, :-1], "labels": labels}


def test_val_loss_and_bits_per_byte_match_an_independent_computation():
    torch.manual_seed(0)
    model = Z2allForCausalLM(Z2allConfig.from_preset(
        "tiny", vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=64)).eval()
    dataset = RandomTokens(12, 16, 64)
    loader = eval_loader(dataset, torch.utils.data.default_collate, batch_size=4,
                         eval_samples=8, env=_env())
    metrics = evaluate_language_model(model, loader, ByteTokenizer(), _env())

    nll = tokens = num_bytes = 0.0
    for index in fixed_eval_indices(len(dataset), 8, _env()):
        item = dataset[index]
        logits = model(item["input_ids"][None]).logits[0].float()
        nll += F.cross_entropy(logits, item["labels"], ignore_index=-100, reduction="sum").item()
        kept = item["labels"][item["labels"] != -100].tolist()
        tokens += len(kept)
        num_bytes += sum(t % 3 + 1 for t in kept)
    assert metrics["val_tokens"] == tokens
    assert metrics["val_loss"] == pytest.approx(nll / tokens, rel=1e-5)
    assert metrics["val_bpb"] == pytest.approx(nll / (math.log(2) * num_bytes), rel=1e-5)
    assert metrics["val_ppl"] == pytest.approx(math.exp(nll / tokens), rel=1e-5)


def test_forward_step_metrics_are_means_over_samples_not_batches():
    """11 pairs in batches of 4, 4, 3: a plain mean of batch means would weight the last
    batch's pairs more. The evaluator gives each batch the whole set's count of pairs
    (trainer/global_batch.py), which the forward step divides its sums by. Reference:
    per-pair means in Python floats."""
    values = torch.randn(11, dtype=torch.float64)
    loader = torch.utils.data.DataLoader(
        [{"x": v, "chosen_labels": torch.zeros(3, dtype=torch.long)} for v in values],
        batch_size=4)

    def forward_step(batch):
        pairs = batch[PAIRS]
        return batch["x"].sum() / pairs, {"square": (batch["x"] ** 2).sum() / pairs}

    metrics = evaluate_with_forward_step(forward_step, loader, _env())
    assert set(metrics) == {"val_loss", "val_square"}
    assert metrics["val_loss"] == pytest.approx(sum(values.tolist()) / 11, rel=1e-12)
    assert metrics["val_square"] == pytest.approx(sum(v * v for v in values.tolist()) / 11,
                                                  rel=1e-12)
