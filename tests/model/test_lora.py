"""model/lora.py against peft (the reference LoRA): the layer's output and gradients, the
trainable-parameter count on the same model, merge/unmerge, adapters off = the base model."""

from __future__ import annotations

import copy

import peft
import pytest
import torch
from torch import nn
from transformers import LlamaForCausalLM

from model.convert_to_hf import export_hf
from model.lora import (
    LoraConfig,
    LoraLinear,
    adapters_disabled,
    apply_lora,
    load_lora_state_dict,
    lora_state_dict,
    merge_and_unload,
    merge_lora,
    unmerge_lora,
)
from tests.model.model_helpers import random_batch, small_model

HIDDEN, Q_ROWS, KV_ROWS = 16, 8, 4


class SeparateProjections(nn.Module):
    """HF's layout: q, k and v as three layers, their outputs side by side."""

    def __init__(self, fused: nn.Linear) -> None:
        super().__init__()
        q, k, v = fused.weight.detach().split([Q_ROWS, KV_ROWS, KV_ROWS])
        for name, weight in zip(("q_proj", "k_proj", "v_proj"), (q, k, v)):
            layer = nn.Linear(HIDDEN, len(weight), bias=False)
            layer.weight.data.copy_(weight)
            setattr(self, name, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)


def fused_and_peft_pair(dropout: float) -> tuple[LoraLinear, nn.Module]:
    """Our LoraLinear on a fused q/k/v matrix (adapters on q and v) and peft on HF's separate
    layers, with the same random A and B (B nonzero, as after some training)."""
    torch.manual_seed(0)
    fused = nn.Linear(HIDDEN, Q_ROWS + 2 * KV_ROWS, bias=False)
    reference = SeparateProjections(fused)
    config = LoraConfig(rank=3, alpha=6.0, dropout=dropout, targets="q_proj,v_proj")
    ours = LoraLinear(fused, [("q_proj", Q_ROWS), ("k_proj", KV_ROWS), ("v_proj", KV_ROWS)],
                      config)
    reference = peft.inject_adapter_in_model(peft.LoraConfig(
        r=3, lora_alpha=6.0, lora_dropout=dropout, target_modules=["q_proj", "v_proj"]),
        reference)
    with torch.no_grad():
        for name in ("q_proj", "v_proj"):
            nn.init.normal_(ours.lora_B[name])
            peft_layer = getattr(reference, name)
            peft_layer.lora_A["default"].weight.copy_(ours.lora_A[name])
            peft_layer.lora_B["default"].weight.copy_(ours.lora_B[name])
    return ours, reference


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_layer_output_and_gradients_equal_peft(dropout):
    ours, reference = fused_and_peft_pair(dropout)
    x = torch.randn(2, 5, HIDDEN)
    output_weights = torch.randn(2, 5, Q_ROWS + 2 * KV_ROWS)
    results = []
    for layer in (ours, reference):
        layer.train()
        inputs = x.clone().requires_grad_(True)
        torch.manual_seed(7)  # same dropout masks: both draw q's, then v's, in that order
        out = layer(inputs)
        (out * output_weights).sum().backward()
        results.append((out, inputs.grad))
    (our_out, our_input_grad), (peft_out, peft_input_grad) = results
    torch.testing.assert_close(our_out, peft_out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(our_input_grad, peft_input_grad, rtol=1e-6, atol=1e-6)
    for name in ("q_proj", "v_proj"):
        peft_layer = getattr(reference, name)
        for ours_param, peft_param in ((ours.lora_A[name], peft_layer.lora_A["default"].weight),
                                       (ours.lora_B[name], peft_layer.lora_B["default"].weight)):
            assert ours_param.grad.abs().sum() > 0
            torch.testing.assert_close(ours_param.grad, peft_param.grad, rtol=1e-6, atol=1e-6)
    assert ours.weight.grad is None  # frozen


def randomized_lora_model(targets: str = LoraConfig.targets, seed: int = 0):
    """(base model, a deep copy with adapters whose B is random)."""
    base = small_model("gqa", seed=seed)
    lora_model = apply_lora(copy.deepcopy(base), LoraConfig(rank=4, alpha=8.0,
                                                            targets=targets))
    with torch.no_grad():
        for name, param in lora_model.named_parameters():
            if ".lora_B." in name:
                param.normal_(0, 0.05)
    return base, lora_model


def logits(model, input_ids):
    with torch.no_grad():
        return model.eval()(input_ids).logits


def test_only_adapters_train_and_their_count_equals_peft(tmp_path):
    base = small_model("gqa", seed=1)
    export_hf(base, tmp_path / "hf")
    for targets in (LoraConfig.targets, "k_proj,up_proj"):
        lora_model = apply_lora(copy.deepcopy(base), LoraConfig(rank=4, targets=targets))
        trainable = {n for n, p in lora_model.named_parameters() if p.requires_grad}
        assert trainable and all(".lora_" in name for name in trainable)
        hf_model = peft.get_peft_model(LlamaForCausalLM.from_pretrained(tmp_path / "hf"),
                                       peft.LoraConfig(r=4, target_modules=targets.split(",")))
        peft_trainable, _ = hf_model.get_nb_trainable_parameters()
        assert sum(p.numel() for p in lora_model.parameters() if p.requires_grad) \
            == peft_trainable


def test_fresh_adapters_and_adapters_off_give_the_base_model():
    base = small_model("gqa", seed=2)
    input_ids, _ = random_batch(2, 12)
    fresh = apply_lora(copy.deepcopy(base), LoraConfig(rank=4))
    assert torch.equal(logits(fresh, input_ids), logits(base, input_ids))  # B starts at 0
    base, trained = randomized_lora_model("q_proj,v_proj,down_proj", seed=2)
    assert not torch.allclose(logits(trained, input_ids), logits(base, input_ids))
    with adapters_disabled(trained):
        assert torch.equal(logits(trained, input_ids), logits(base, input_ids))
    assert not torch.allclose(logits(trained, input_ids), logits(base, input_ids))


def test_merge_unmerge_and_merge_and_unload():
    base, lora_model = randomized_lora_model("q_proj,k_proj,o_proj,gate_proj,down_proj")
    input_ids, _ = random_batch(2, 12)
    expected = logits(lora_model, input_ids)
    weights_before = {n: p.clone() for n, p in lora_model.named_parameters()}
    merge_lora(lora_model)
    torch.testing.assert_close(logits(lora_model, input_ids), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unmerge_lora"), adapters_disabled(lora_model):
        pass
    unmerge_lora(lora_model)
    for name, param in lora_model.named_parameters():
        torch.testing.assert_close(param, weights_before[name], rtol=0, atol=1e-7)
    torch.testing.assert_close(logits(lora_model, input_ids), expected, rtol=1e-5, atol=1e-5)
    plain = merge_and_unload(lora_model)
    assert plain.state_dict().keys() == base.state_dict().keys()
    assert not any(isinstance(m, LoraLinear) for m in plain.modules())
    torch.testing.assert_close(logits(plain, input_ids), expected, rtol=1e-5, atol=1e-5)


def test_adapter_state_dict_round_trip_and_mismatch():
    _, lora_model = randomized_lora_model()
    state = lora_state_dict(lora_model)
    assert state and all(".lora_" in name for name in state)
    _, fresh = randomized_lora_model(seed=0)
    with torch.no_grad():
        for name, param in fresh.named_parameters():
            if ".lora_" in name:
                param.normal_()
    load_lora_state_dict(fresh, state)
    input_ids, _ = random_batch(2, 12)
    assert torch.equal(logits(fresh, input_ids), logits(lora_model, input_ids))
    _, other_targets = randomized_lora_model("q_proj")
    with pytest.raises(ValueError, match="missing"):
        load_lora_state_dict(other_targets, state)


@pytest.mark.parametrize("options, message", [
    (dict(rank=-1), "--lora_rank"), (dict(rank=4, dropout=1.0), "--lora_dropout"),
    (dict(rank=4, targets="q_proj,qkv_proj"), "--lora_targets")])
def test_bad_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        LoraConfig(**options)
