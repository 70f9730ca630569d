"""Each torch fallback in model/kernels.py and model/chunked_lm_head.py vs its plain-math
reference in model/reference_ops.py: values and gradients, on fresh random inputs."""

from __future__ import annotations

import pytest
import torch

from model import chunked_lm_head, kernels, reference_ops
from model.attention import (
    attention_layout_for,
    attention_mask_for,
    packed_tokens_for,
    position_ids_for,
)
from model.rope import rotary_cos_sin

ATOL = 1e-5


def _leaf(*shape, scale=1.0):
    return (torch.randn(*shape, dtype=torch.float32) * scale).requires_grad_()


def _query_key_value(batch, query_len, key_len, heads, kv_heads, head_dim=8):
    return (_leaf(batch, query_len, heads, head_dim), _leaf(batch, key_len, kv_heads, head_dim),
            _leaf(batch, key_len, kv_heads, head_dim))


def _assert_same_values_and_grads(fast_fn, reference_fn, inputs, atol=ATOL):
    fast_out, reference_out = fast_fn(*inputs), reference_fn(*inputs)
    assert torch.allclose(fast_out, reference_out, atol=atol)
    upstream = torch.randn_like(fast_out)  # a random cotangent checks every output element
    fast_grads = torch.autograd.grad(fast_out, inputs, upstream)
    reference_grads = torch.autograd.grad(reference_out, inputs, upstream)
    for fast_grad, reference_grad in zip(fast_grads, reference_grads):
        assert torch.allclose(fast_grad, reference_grad, atol=atol)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("padded", [False, True])
def test_attention_matches_reference(heads, kv_heads, padded):
    batch, seq = 3, 10
    padding = None
    if padded:
        padding = torch.ones(batch, seq, dtype=torch.long)
        padding[0, :4] = 0  # left padding
        padding[1, 7:] = 0  # right padding
    allowed, _ = attention_mask_for(padding, seq, 0, torch.device("cpu"))
    layout = attention_layout_for(padding, seq, 0, torch.device("cpu"), use_flash=False)
    _assert_same_values_and_grads(
        lambda q, k, v: kernels.attention(q, k, v, layout),
        lambda q, k, v: reference_ops.attention_reference(q, k, v, allowed),
        _query_key_value(batch, seq, seq, heads, kv_heads))


def test_attention_decode_step_with_cache_matches_reference():
    """One new query against 7 cached keys, two of them padding."""
    past = 7
    padding = torch.ones(2, past + 1, dtype=torch.long)
    padding[1, :2] = 0
    allowed, _ = attention_mask_for(padding, 1, past, torch.device("cpu"))
    layout = attention_layout_for(padding, 1, past, torch.device("cpu"), use_flash=False)
    _assert_same_values_and_grads(
        lambda q, k, v: kernels.attention(q, k, v, layout),
        lambda q, k, v: reference_ops.attention_reference(q, k, v, allowed),
        _query_key_value(2, 1, past + 1, heads=4, kv_heads=2))


def test_rms_norm_matches_reference():
    x, weight = _leaf(4, 6, 32, scale=3.0), _leaf(32)
    _assert_same_values_and_grads(lambda a, w: kernels.rms_norm(a, w, 1e-5),
                                  lambda a, w: reference_ops.rms_norm_reference(a, w, 1e-5),
                                  (x, weight))


def test_rms_norm_bf16_input_is_normalised_in_fp32():
    x, weight = torch.randn(8, 64) * 50, torch.randn(64)
    out = kernels.rms_norm(x.bfloat16(), weight.bfloat16(), 1e-5)
    expected = reference_ops.rms_norm_reference(x.bfloat16().float(), weight.bfloat16().float(),
                                                1e-5)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("left_padded", [False, True])
def test_rotary_matches_complex_rotation(left_padded):
    batch, seq, heads, head_dim, theta = 2, 9, 3, 16, 777.0
    padding = None
    if left_padded:
        padding = torch.ones(batch, seq, dtype=torch.long)
        padding[1, :3] = 0
    position_ids = position_ids_for(padding, seq, 0, torch.device("cpu"))
    cos, sin = rotary_cos_sin(position_ids, head_dim, theta, torch.float32)
    full_positions = position_ids.expand(batch, seq)
    _assert_same_values_and_grads(
        lambda x: kernels.apply_rotary(x, cos, sin),
        lambda x: reference_ops.rotary_reference(x, full_positions, theta),
        (_leaf(batch, seq, heads, head_dim),))


def test_swiglu_matches_reference():
    _assert_same_values_and_grads(kernels.swiglu, reference_ops.swiglu_reference,
                                  (_leaf(5, 7, 24, scale=2.0), _leaf(5, 7, 24)))


@pytest.fixture
def small_chunks(monkeypatch):
    """Force many chunks (and a ragged last one) on tiny inputs."""
    monkeypatch.setattr(chunked_lm_head, "CHUNK_LOGIT_ELEMENTS", 7 * 96)


def _lm_head_inputs(rows=50, hidden=16, vocab=96):
    labels = torch.randint(0, vocab, (rows,))
    labels[torch.rand(rows) < 0.3] = -100
    return _leaf(rows, hidden), _leaf(vocab, hidden), labels


def test_chunked_cross_entropy_matches_reference(small_chunks):
    hidden, weight, labels = _lm_head_inputs()
    _assert_same_values_and_grads(
        lambda h, w: chunked_lm_head.linear_cross_entropy(h, w, labels),
        lambda h, w: reference_ops.cross_entropy_reference(h, w, labels), (hidden, weight))


def test_chunked_cross_entropy_all_ignored_is_zero_not_nan(small_chunks):
    hidden, weight, labels = _lm_head_inputs()
    loss = chunked_lm_head.linear_cross_entropy(hidden, weight, torch.full_like(labels, -100))
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(hidden.grad) == 0


def test_chunked_token_log_probs_match_log_softmax_gather(small_chunks):
    hidden, weight, labels = _lm_head_inputs()

    def reference(h, w):
        log_probs = (h @ w.T).double().log_softmax(dim=-1)
        picked = log_probs.gather(-1, labels.clamp(min=0)[:, None])[:, 0]
        return picked.masked_fill(labels == -100, 0.0).float()

    _assert_same_values_and_grads(
        lambda h, w: chunked_lm_head.linear_token_log_probs(h, w, labels), reference,
        (hidden, weight))


def test_chunked_cross_entropy_under_bf16_autocast(small_chunks):
    """fp32 parameters, bf16 matmuls: grads reach the fp32 leaves and stay close to fp32."""
    hidden, weight, labels = _lm_head_inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = chunked_lm_head.linear_cross_entropy(hidden, weight, labels)
    loss.backward()
    reference = reference_ops.cross_entropy_reference(hidden, weight, labels)
    reference_grad = torch.autograd.grad(reference, weight)[0]
    assert loss.dtype == torch.float32 and weight.grad.dtype == torch.float32
    assert torch.allclose(loss, reference, rtol=2e-2)
    assert torch.allclose(weight.grad, reference_grad, atol=2e-2 * reference_grad.abs().max())


def test_packed_tokens_follow_the_worked_example():
    """model/kernels.py's PackedTokens example, and a decode step after a left-padded prompt
    (one new query sees the row's 3 real keys: cu_seqlens_k counts keys, not queries)."""
    packed = packed_tokens_for(torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]), query_len=4)
    assert packed.query_rows.tolist() == [0, 0, 0, 1, 1]
    assert packed.query_cols.tolist() == [0, 1, 2, 0, 1]
    assert packed.cu_seqlens_q.tolist() == [0, 3, 5] and packed.cu_seqlens_q.dtype == torch.int32
    assert packed.max_seqlen_q == 3 and packed.max_seqlen_k == 3
    decode = packed_tokens_for(torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]), query_len=1)
    assert decode.query_cols.tolist() == [0, 0] and decode.cu_seqlens_q.tolist() == [0, 1, 2]
    assert decode.cu_seqlens_k.tolist() == [0, 3, 7] and decode.key_cols.tolist()[:3] == [1, 2, 3]
