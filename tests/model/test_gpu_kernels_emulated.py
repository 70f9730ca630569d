"""The model's GPU branches (flash-attn, apex) run on CPU against plain-torch emulations of the
libraries (tests/fake_gpu_libs), and must give what the torch path gives: logits, gradients,
KV-cache decoding, padded batches. The fakes count their calls, so a branch that silently falls
back to torch fails the call-count assertions."""

from __future__ import annotations

import sys

import pytest
import torch

from model import kernels, reference_ops
from optimizer import adamw
from optimizer.optimizer_config import OptimizerConfig
from parallel.context_parallel import flash_blocks
from tests import fake_gpu_libs
from tests.fake_gpu_libs import CALLS
from tests.fake_gpu_libs.flash_attn import flash_attn_func, flash_attn_varlen_func
from tests.fake_gpu_libs.flash_attn.layers.rotary import apply_rotary_emb
from tests.model.model_helpers import ATTENTION_KINDS, VOCAB, small_model
from utils import gpu_libraries

BF16_TOLERANCE = 3e-2  # of the largest magnitude: bf16 keeps 8 bits, paths round differently


def use_emulated_gpu_libraries(monkeypatch) -> None:
    """From here on, the CPU is 'the GPU' and flash_attn/apex are the fakes."""
    fake_gpu_libs.install(monkeypatch)
    monkeypatch.setattr(gpu_libraries, "KERNEL_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(gpu_libraries, "compute_capability", fake_gpu_libs.device_capability)
    probe_gpu_libraries_again(monkeypatch)


def probe_gpu_libraries_again(monkeypatch) -> None:
    """Re-run the import-time probes (after a test changed what the fakes offer)."""
    monkeypatch.setattr(kernels, "gpu_kernels", kernels.find_gpu_kernels())
    monkeypatch.setattr(flash_blocks, "flash_kernels", flash_blocks.find_flash_kernels())
    monkeypatch.setattr(adamw, "apex_fused_adam", gpu_libraries.import_optional(
        "apex.optimizers", "FusedAdam", lambda: gpu_libraries.apex_extension_problem("amp_C")))


def assert_close(got: torch.Tensor, expected: torch.Tensor, name: str = "") -> None:
    scale = expected.float().abs().max().clamp(min=1e-6)
    error = (got.float() - expected.float()).abs().max()
    assert error <= BF16_TOLERANCE * scale, f"{name}: max error {error:.3g}, scale {scale:.3g}"


def _batch(padding: str, batch_size: int = 3, seq_len: int = 12):
    generator = torch.Generator().manual_seed(7)
    input_ids = torch.randint(0, VOCAB, (batch_size, seq_len), generator=generator)
    labels = torch.randint(0, VOCAB, (batch_size, seq_len), generator=generator)
    mask = torch.ones(batch_size, seq_len, dtype=torch.long)
    if padding == "right":  # SFT/DPO collators pad on the right
        mask[0, 8:] = 0
        mask[2, 5:] = 0
    elif padding == "left":
        mask[1, :4] = 0
    elif padding == "packed":  # dataset/sft_packing.py: sample numbers, then right padding
        mask[0] = torch.tensor([1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 0, 0])
        mask[2, 5:] = 2
    labels = labels.masked_fill(mask == 0, -100)
    return input_ids, labels, (None if padding == "none" else mask)


def _logits_and_grads(model, input_ids, labels, mask):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids, attention_mask=mask).logits
    model(input_ids, labels=labels, attention_mask=mask).loss.backward()
    real = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask.bool()
    return logits[real], {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("kind", list(ATTENTION_KINDS))
@pytest.mark.parametrize("padding", ["none", "right", "left", "packed"])
def test_flash_and_apex_branches_match_the_torch_path(monkeypatch, kind, padding):
    model = small_model(kind).to(torch.bfloat16)
    batch = _batch(padding)
    expected_logits, expected_grads = _logits_and_grads(model, *batch)

    use_emulated_gpu_libraries(monkeypatch)
    logits, grads = _logits_and_grads(model, *batch)

    attention_kernel = "flash_attn_func" if padding == "none" else "flash_attn_varlen_func"
    layers_times_passes = 2 * model.config.num_hidden_layers  # two forwards, one backward
    assert CALLS[attention_kernel] == layers_times_passes
    assert CALLS["fused_rms_norm_affine"] == (2 * model.config.num_hidden_layers + 1) * 2
    assert CALLS["swiglu"] == layers_times_passes
    # one position table for the batch only without padding; padded rows take the torch path
    assert CALLS["apply_rotary_emb"] == (2 * layers_times_passes if padding == "none" else 0)
    assert_close(logits, expected_logits, "logits")
    for name, grad in grads.items():
        assert_close(grad, expected_grads[name], name)


@pytest.mark.parametrize("kind", list(ATTENTION_KINDS))
@pytest.mark.parametrize("left_padded", [False, True])
def test_kv_cache_decoding_with_flash_matches_the_torch_path(monkeypatch, kind, left_padded):
    """Prefill a prompt, then feed 3 more tokens one at a time: every step's logits agree."""
    model = small_model(kind).to(torch.bfloat16).eval()
    prompt = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(prompt)
    if left_padded:
        mask[0, :3] = 0
    steps = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(4))

    def decode():
        cache, key_mask = model.new_kv_cache(2, capacity=8), mask
        logits = [model.next_token_logits(prompt, key_mask if left_padded else None, cache)]
        for step in range(steps.shape[1]):
            key_mask = torch.cat([key_mask, torch.ones(2, 1, dtype=key_mask.dtype)], dim=1)
            logits.append(model.next_token_logits(steps[:, step:step + 1],
                                                  key_mask if left_padded else None, cache))
        return torch.stack(logits)

    with torch.no_grad():
        expected = decode()
        use_emulated_gpu_libraries(monkeypatch)
        got = decode()
    attention_kernel = "flash_attn_varlen_func" if left_padded else "flash_attn_func"
    assert CALLS[attention_kernel] == 4 * model.config.num_hidden_layers
    assert_close(got, expected, "decode logits")


def test_padded_sft_batch_gives_the_same_loss_with_flash_varlen(monkeypatch):
    model = small_model("gqa").to(torch.bfloat16)
    input_ids, labels, mask = _batch("right")
    with torch.no_grad():
        expected = model(input_ids, labels=labels, attention_mask=mask).loss
        use_emulated_gpu_libraries(monkeypatch)
        loss = model(input_ids, labels=labels, attention_mask=mask).loss
    assert CALLS["flash_attn_varlen_func"] == model.config.num_hidden_layers
    assert CALLS["flash_attn_func"] == 0
    assert abs(loss.item() - expected.item()) <= 1e-2 * expected.item()


def test_fp32_model_falls_back_to_sdpa_and_says_why(monkeypatch):
    use_emulated_gpu_libraries(monkeypatch)
    model = small_model("gqa")
    model(*_batch("none")[:1])
    assert CALLS["flash_attn_func"] == 0 and CALLS["fused_rms_norm_affine"] > 0
    cpu = torch.device("cpu")
    choices = kernels.kernel_choices(cpu, torch.float32, model.config.head_dim)
    assert choices["attention"] == "torch-sdpa (float32: flash-attn runs fp16/bf16 only)"
    assert kernels.kernel_choices(cpu, torch.bfloat16, 16)["attention"].startswith("flash-attn")
    assert kernels.kernel_choices(cpu, torch.bfloat16, 288)["attention"] == (
        "torch-sdpa (head_dim 288 > 256)")


# ---- the fakes against the formulas, and their input checks ----------------------------------

@pytest.mark.parametrize("query_len,key_len", [(6, 6), (2, 6), (1, 6)])
def test_fake_flash_causal_mask_is_bottom_right_aligned(query_len, key_len):
    """flash-attn >= 2.1 aligns the causal diagonal to the bottom-right corner: T queries after
    S - T cached keys see them all. Checked against the plain softmax formula."""
    q = torch.randn(2, query_len, 4, 16, dtype=torch.bfloat16)
    k, v = (torch.randn(2, key_len, 2, 16, dtype=torch.bfloat16) for _ in range(2))
    expected = reference_ops.attention_reference(q.double(), k.double(), v.double(), None)
    assert_close(flash_attn_func(q, k, v, causal=True), expected)
    cu_q = torch.tensor([0, query_len, 2 * query_len], dtype=torch.int32)
    cu_k = torch.tensor([0, key_len, 2 * key_len], dtype=torch.int32)
    packed = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q,
                                    cu_k, query_len, key_len, causal=True)
    assert_close(packed.view_as(q), expected)


@pytest.mark.parametrize("version", ["2.8.3", "2.5.9"])
def test_fake_flash_returns_the_lse_in_the_real_layouts(monkeypatch, version):
    """`return_attn_probs=True` (no dropout): (out, lse, empty probabilities), the lse = log
    sum exp of the scaled, masked scores (the formula) in fp32, [B, H, T] from flash_attn_func,
    [H, total_q] from the varlen function since 2.6 and padded [B, H, max_seqlen_q] before,
    +inf on a row that sees no key (3 queries after 2 keys, causal: the first sees none)."""
    monkeypatch.setattr(sys.modules["tests.fake_gpu_libs.flash_attn"], "__version__", version)
    q = torch.randn(2, 3, 4, 16, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 2, 16, dtype=torch.bfloat16) for _ in range(2))
    scores = torch.einsum("bthd,bshd->bhts", q.double(),
                          k.double().repeat_interleave(2, dim=2)) / 16 ** 0.5
    visible = torch.ones(3, 2, dtype=torch.bool).tril(-1)
    expected = scores.masked_fill(~visible, float("-inf")).logsumexp(dim=-1).float()
    expected = expected.masked_fill(expected.isneginf(), float("inf"))  # [B, H, T]
    out, lse, probs = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert lse.dtype == torch.float32 and probs.numel() == 0
    torch.testing.assert_close(lse, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(out, flash_attn_func(q, k, v, causal=True))
    cu_q, cu_k = (torch.tensor([0, n, 2 * n], dtype=torch.int32) for n in (3, 2))
    _, lse, _ = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q,
                                       cu_k, 4, 2, causal=True, return_attn_probs=True)
    if version == "2.8.3":
        torch.testing.assert_close(lse, expected.transpose(0, 1).flatten(1), rtol=1e-5,
                                   atol=1e-5)
    else:  # max_seqlen_q 4: one padded column per sequence
        assert lse.shape == (2, 4, 4) and lse[..., 3].isnan().all()
        torch.testing.assert_close(lse[..., :3], expected, rtol=1e-5, atol=1e-5)


def test_fake_flash_rejects_what_the_real_kernel_rejects():
    q = torch.randn(1, 4, 2, 16)
    with pytest.raises(RuntimeError, match="fp16 and bf16"):
        flash_attn_func(q, q, q, causal=True)
    big = torch.randn(1, 4, 2, 288, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="at most 256"):
        flash_attn_func(big, big, big)
    half = q.bfloat16().flatten(0, 1)
    with pytest.raises(RuntimeError, match="int32"):
        flash_attn_varlen_func(half, half, half, torch.tensor([0, 4]), torch.tensor([0, 4]), 4, 4)
    with pytest.raises(RuntimeError, match="max_seqlen"):
        cu = torch.tensor([0, 4], dtype=torch.int32)
        flash_attn_varlen_func(half, half, half, cu, cu, 3, 4)
    with pytest.raises(AssertionError, match="same dtype"):
        apply_rotary_emb(q.bfloat16(), torch.ones(4, 8), torch.zeros(4, 8))


def test_fake_rotary_is_the_half_split_rotation():
    x = torch.randn(2, 5, 3, 16, dtype=torch.bfloat16)
    positions = torch.arange(5)[None].expand(2, 5)
    half = 8
    angles = torch.arange(5)[:, None] * 500.0 ** (-torch.arange(half) * 2 / 16)
    got = apply_rotary_emb(x, angles.cos().bfloat16(), angles.sin().bfloat16())
    assert_close(got, reference_ops.rotary_reference(x.double(), positions, 500.0))


# ---- apex FusedAdam ---------------------------------------------------------------------------

def _adamw_after_steps(param_groups, steps=3):
    optimizer = adamw.build_adamw(param_groups, OptimizerConfig(lr=0.1, weight_decay=0.1))
    params = [p for group in param_groups for p in group["params"]]
    for step in range(steps):
        for p in params:
            p.grad = torch.sin(p.detach() * (step + 1))
        optimizer.step()
    return optimizer, params


def _decay_groups(values, with_empty_group):
    matrix = torch.nn.Parameter(values.clone())
    vectors = [torch.nn.Parameter(values[0].clone())] if not with_empty_group else []
    return [{"params": [matrix], "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}]


@pytest.mark.parametrize("with_empty_group", [False, True])
def test_apex_fused_adam_matches_torch_adamw_and_skips_empty_groups(monkeypatch,
                                                                    with_empty_group):
    """A ZeRO-1 shard may hold no vector params: the empty group must not reach FusedAdam
    (releases before March 2023 crash on it; the fake does too)."""
    values = torch.randn(4, 6)
    torch_optimizer, expected = _adamw_after_steps(_decay_groups(values, with_empty_group))
    assert isinstance(torch_optimizer, torch.optim.AdamW)

    use_emulated_gpu_libraries(monkeypatch)
    apex_optimizer, got = _adamw_after_steps(_decay_groups(values, with_empty_group))
    assert type(apex_optimizer).__name__ == "FusedAdam" and CALLS["FusedAdam.step"] == 3
    for p, q in zip(got, expected, strict=True):
        assert torch.allclose(p, q, atol=1e-6)
    exp_avg, exp_avg_sq, step = adamw.read_adam_state(apex_optimizer, got[0])
    assert step == 3 and exp_avg.shape == got[0].shape
    adamw.write_adam_state(apex_optimizer, got[0], exp_avg, exp_avg_sq, 7)
    assert adamw.read_adam_state(apex_optimizer, got[0])[2] == 7


def test_fake_fused_adam_crashes_on_an_empty_group_like_old_apex(monkeypatch):
    use_emulated_gpu_libraries(monkeypatch)
    optimizer = adamw.apex_fused_adam.value([{"params": []}, {"params": [torch.zeros(2)]}])
    with pytest.raises(IndexError):
        optimizer.step()


def test_optional_import_says_why_a_library_is_missing(tmp_path, monkeypatch):
    (tmp_path / "broken_gpu_lib.py").write_text("raise OSError('libcudart.so.12: not found')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert gpu_libraries.import_optional("no_such_gpu_lib.ops", "f").missing_reason == (
        "no_such_gpu_lib not installed")
    broken = gpu_libraries.import_optional("broken_gpu_lib", "f")
    assert broken.value is None
    assert broken.missing_reason == "import failed: OSError: libcudart.so.12: not found"


# ---- the probes: a library that imports but would not run is not used -----------------------

def test_apex_without_its_cuda_extensions_is_not_used(monkeypatch):
    """A source install of apex without --cuda_ext imports, then FusedAdam raises 'requires
    cuda extensions' and the first norm dies on the missing fused_layer_norm_cuda."""
    use_emulated_gpu_libraries(monkeypatch)
    for extension in fake_gpu_libs.APEX_EXTENSIONS:
        monkeypatch.setitem(sys.modules, extension, None)  # import raises ModuleNotFoundError
    probe_gpu_libraries_again(monkeypatch)
    model = small_model("gqa").to(torch.bfloat16)
    _logits_and_grads(model, *_batch("none"))
    assert CALLS["fused_rms_norm_affine"] == 0 and CALLS["flash_attn_func"] > 0
    reason = kernels.kernel_choices(torch.device("cpu"), torch.bfloat16, 16)["rms_norm"]
    assert reason.startswith("torch-fp32 (apex built without its CUDA extensions "
                             "(no fused_layer_norm_cuda)")
    assert "(no amp_C)" in adamw.adamw_implementation(torch.device("cpu"))
    optimizer, _ = _adamw_after_steps(_decay_groups(torch.randn(4, 6), False))
    assert isinstance(optimizer, torch.optim.AdamW) and CALLS["FusedAdam.step"] == 0


def test_flash_attn_is_not_used_below_compute_capability_8(monkeypatch):
    """flash-attn 2 raises 'only supports Ampere GPUs or newer' on a V100/T4."""
    use_emulated_gpu_libraries(monkeypatch)
    monkeypatch.setattr(fake_gpu_libs, "EMULATED_CAPABILITY", (7, 5))
    model = small_model("gqa").to(torch.bfloat16)
    expected_logits, _ = _logits_and_grads(model, *_batch("right"))
    assert CALLS["flash_attn_func"] + CALLS["flash_attn_varlen_func"] == 0
    assert kernels.kernel_choices(torch.device("cpu"), torch.bfloat16, 16)["attention"] == (
        "torch-sdpa (sm75: flash-attn 2 needs compute capability >= 8.0 (Ampere))")
    monkeypatch.setattr(fake_gpu_libs, "EMULATED_CAPABILITY", (8, 0))
    logits, _ = _logits_and_grads(model, *_batch("right"))
    assert CALLS["flash_attn_varlen_func"] > 0
    assert_close(logits, expected_logits, "logits on sm80 vs sm75")


def test_flash_attn_before_2_1_is_not_used_for_kv_cache_decoding(monkeypatch):
    """2.0.x aligns the causal mask top-left: with a KV cache the new query would see only the
    first key. The fake does the same, so using it would break the decoding comparison."""
    model = small_model("gqa").to(torch.bfloat16).eval()
    prompt = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(5))
    step = torch.randint(0, VOCAB, (2, 1), generator=torch.Generator().manual_seed(6))

    def decode():
        cache = model.new_kv_cache(2, capacity=8)
        model.next_token_logits(prompt, None, cache)
        return model.next_token_logits(step, None, cache)

    with torch.no_grad():
        expected = decode()
        use_emulated_gpu_libraries(monkeypatch)
        monkeypatch.setattr(sys.modules["flash_attn"], "__version__", "2.0.9")
        q = torch.randn(1, 1, 2, 16, dtype=torch.bfloat16)
        k, v = torch.randn(1, 3, 2, 16, dtype=torch.bfloat16), torch.randn(1, 3, 2, 16).bfloat16()
        assert torch.equal(flash_attn_func(q, k, v, causal=True), v[:, :1])  # top-left: key 0
        probe_gpu_libraries_again(monkeypatch)
        got = decode()
    assert CALLS["flash_attn_func"] == 1  # only the direct call above
    assert kernels.kernel_choices(torch.device("cpu"), torch.bfloat16, 16)["attention"] == (
        "torch-sdpa (flash_attn 2.0.9 < 2.1 (top-left causal mask breaks KV-cache decoding))")
    assert_close(got, expected, "decode logits")
