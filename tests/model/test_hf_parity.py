"""Our model vs transformers' LlamaForCausalLM with the same weights, converted both ways."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from model.convert_to_hf import export_hf
from model.modeling_z2all import Z2allForCausalLM
from tests.model.model_helpers import ATTENTION_KINDS, VOCAB, left_padded, random_batch, small_model

TOLERANCE = 1e-5


def _export_and_load_hf(model: Z2allForCausalLM, tmp_path) -> LlamaForCausalLM:
    export_hf(model, tmp_path / "hf")
    return LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()


def _random_hf_model(kind: str, tie: bool, tmp_path) -> tuple[LlamaForCausalLM, object]:
    heads, kv_heads = ATTENTION_KINDS[kind]
    torch.manual_seed(3)
    hf_config = LlamaConfig(vocab_size=200, hidden_size=64, intermediate_size=160,
                            num_hidden_layers=2, num_attention_heads=heads,
                            num_key_value_heads=kv_heads, rms_norm_eps=1e-6,
                            max_position_embeddings=64, tie_word_embeddings=tie,
                            initializer_range=0.1, rope_parameters={"rope_type": "default",
                                                                    "rope_theta": 1234.0})
    hf_model = LlamaForCausalLM(hf_config).eval()
    hf_model.save_pretrained(tmp_path / "hf_random")
    return hf_model, tmp_path / "hf_random"


@pytest.mark.parametrize("kind", sorted(ATTENTION_KINDS))
@pytest.mark.parametrize("tie", [True, False])
def test_export_hf_logits_and_loss_match(kind, tie, tmp_path):
    model = small_model(kind, tie_word_embeddings=tie).eval()
    hf_model = _export_and_load_hf(model, tmp_path)
    input_ids, labels = random_batch(3, 17)
    with torch.no_grad():
        ours = model(input_ids).logits
        theirs = hf_model(input_ids).logits
        assert (ours - theirs).abs().max() <= TOLERANCE
        # Our loss takes already-shifted labels: compare with a plain CE on HF's logits.
        reference_loss = F.cross_entropy(theirs.flatten(0, 1), labels.flatten())
        assert torch.allclose(model(input_ids, labels=labels).loss, reference_loss, atol=1e-5)


@pytest.mark.parametrize("kind", sorted(ATTENTION_KINDS))
@pytest.mark.parametrize("tie", [True, False])
def test_from_hf_logits_match(kind, tie, tmp_path):
    hf_model, hf_dir = _random_hf_model(kind, tie, tmp_path)
    model = Z2allForCausalLM.from_hf(hf_dir).eval()
    assert model.config.vocab_size == 200  # HF vocabularies are kept exact, not padded
    input_ids = torch.randint(0, 200, (2, 19))
    with torch.no_grad():
        assert (model(input_ids).logits - hf_model(input_ids).logits).abs().max() <= TOLERANCE


@pytest.mark.parametrize("kind", sorted(ATTENTION_KINDS))
def test_padded_batches_match_hf(kind, tmp_path):
    model = small_model(kind).eval()
    hf_model = _export_and_load_hf(model, tmp_path)
    lengths = [11, 6, 9]
    prompts = [torch.randint(0, VOCAB, (n,)).tolist() for n in lengths]
    # Right padding (training): positions are 0..n-1 in both models.
    width = max(lengths)
    right_ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    right_mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    # Left padding (generation): HF needs explicit positions counted over real tokens.
    left_ids, left_mask = left_padded(prompts, pad_id=0)
    left_positions = (left_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours_right = model(right_ids, attention_mask=right_mask).logits
        theirs_right = hf_model(right_ids, attention_mask=right_mask).logits
        ours_left = model(left_ids, attention_mask=left_mask).logits
        theirs_left = hf_model(left_ids, attention_mask=left_mask,
                               position_ids=left_positions).logits
    real_right, real_left = right_mask.bool(), left_mask.bool()
    assert (ours_right - theirs_right)[real_right].abs().max() <= TOLERANCE
    assert (ours_left - theirs_left)[real_left].abs().max() <= TOLERANCE
    # And the same row gives the same logits whatever the padding side.
    assert torch.allclose(ours_right[real_right], ours_left[real_left], atol=TOLERANCE)
    assert torch.isfinite(ours_left).all()  # pad rows must not produce NaN


@pytest.mark.parametrize("kind", sorted(ATTENTION_KINDS))
def test_greedy_generation_matches_hf(kind, tmp_path):
    model = small_model(kind).eval()
    hf_model = _export_and_load_hf(model, tmp_path)
    prompts = [torch.randint(0, VOCAB, (n,)).tolist() for n in (5, 9, 7)]
    input_ids, attention_mask = left_padded(prompts, pad_id=0)
    eos = int(torch.randint(0, VOCAB, ()).item())
    ours = model.generate(input_ids, max_new_tokens=12, attention_mask=attention_mask,
                          eos_token_id=eos, pad_token_id=0)
    theirs = hf_model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=12,
                               do_sample=False, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(ours, theirs)


def test_exported_weights_keep_dtype(tmp_path):
    model = small_model("gqa").to(torch.bfloat16)
    hf_model = _export_and_load_hf(model, tmp_path)
    assert hf_model.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert torch.equal(hf_model.lm_head.weight, model.lm_head.weight)
