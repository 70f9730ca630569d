"""Loss, gradients, tying, checkpointing, saving and the FLOP formula of Z2allForCausalLM."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from model import kernels, reference_ops
from model.configuration_z2all import PRESETS, Z2allConfig
from model.convert_to_hf import main as convert_main
from model.modeling_z2all import Z2allForCausalLM
from tests.model.model_helpers import VOCAB, random_batch, small_config, small_model
from utils.gpu_libraries import OptionalImport


def _grads(model, input_ids, labels, **kwargs):
    model.zero_grad(set_to_none=True)
    model(input_ids, labels=labels, **kwargs).loss.backward()
    return {name: param.grad.clone() for name, param in model.named_parameters()}


def test_loss_ignores_minus_100_and_matches_cross_entropy_on_logits():
    model = small_model("gqa")
    input_ids, labels = random_batch(3, 16)
    assert (labels == -100).any()
    logits = model(input_ids).logits
    reference = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert torch.allclose(model(input_ids, labels=labels).loss, reference, atol=1e-5)
    # Independently: the plain mean over the kept positions only.
    kept = labels.flatten() != -100
    kept_only = F.cross_entropy(logits.flatten(0, 1)[kept], labels.flatten()[kept])
    assert torch.allclose(model(input_ids, labels=labels).loss, kept_only, atol=1e-5)


@pytest.mark.parametrize("tie", [True, False])
def test_every_parameter_gets_a_gradient(tie):
    model = small_model("gqa", tie_word_embeddings=tie)
    grads = _grads(model, *random_batch(2, 12))
    assert set(grads) == {name for name, _ in model.named_parameters()}
    assert all(torch.count_nonzero(grad) > 0 for grad in grads.values())


def test_tied_embeddings_share_storage():
    model = small_model("gqa", tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert len(list(model.parameters())) == len(set(map(id, model.parameters())))
    reloaded = Z2allForCausalLM._from_state_dict(model.config, dict(model.state_dict()), None)
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight


@pytest.mark.parametrize("every,dropout", [(1, 0.0), (2, 0.0), (1, 0.2)])
def test_activation_checkpointing_gives_the_same_gradients(every, dropout):
    """Also with dropout: the recomputation must replay the same dropout masks."""
    batch = random_batch(2, 12)
    plain = small_model("gqa", num_hidden_layers=3, dropout=dropout)
    checkpointed = small_model("gqa", num_hidden_layers=3, dropout=dropout,
                               activation_checkpointing=True,
                               activation_checkpointing_every=every)
    torch.manual_seed(5)
    expected = _grads(plain, *batch)
    torch.manual_seed(5)
    got = _grads(checkpointed, *batch)
    for name in expected:
        assert torch.allclose(got[name], expected[name], atol=1e-6), name


def test_residual_projections_get_scaled_init():
    config = small_config("mha", hidden_size=256, num_hidden_layers=8, initializer_range=0.02)
    torch.manual_seed(0)
    model = Z2allForCausalLM(config)
    layer = model.model.layers[0]
    expected_scaled_std = 0.02 / (2 * 8) ** 0.5
    assert abs(layer.self_attn.qkv_proj.weight.std().item() - 0.02) < 1e-3
    assert abs(layer.mlp.down_proj.weight.std().item() - expected_scaled_std) < 3e-4
    assert abs(layer.self_attn.o_proj.weight.std().item() - expected_scaled_std) < 3e-4


def test_state_dict_and_outputs_do_not_depend_on_kernels(monkeypatch):
    model = small_model("gqa")
    input_ids, labels = random_batch(2, 10)
    keys_before = list(model.state_dict())
    loss_fast = model(input_ids, labels=labels).loss
    monkeypatch.setattr(kernels, "attention", lambda q, k, v, layout, dropout_p:
                        reference_ops.attention_reference(q, k, v, layout.allowed))
    monkeypatch.setattr(kernels, "rms_norm", reference_ops.rms_norm_reference)
    monkeypatch.setattr(kernels, "swiglu", reference_ops.swiglu_reference)
    assert list(model.state_dict()) == keys_before
    assert torch.allclose(model(input_ids, labels=labels).loss, loss_fast, atol=1e-5)


@pytest.mark.parametrize("tie,dtype", [(True, torch.float32), (False, torch.bfloat16)])
def test_save_and_from_pretrained_round_trip(tmp_path, tie, dtype):
    model = small_model("mqa", tie_word_embeddings=tie).to(dtype)
    model.save_pretrained(tmp_path)
    reloaded = Z2allForCausalLM.from_pretrained(tmp_path)
    assert reloaded.config == model.config
    for (name, original), (_, loaded) in zip(model.state_dict().items(),
                                             reloaded.state_dict().items()):
        assert loaded.dtype == dtype and torch.equal(original, loaded), name
    input_ids = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(input_ids).logits, reloaded(input_ids).logits)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]


def test_token_log_probs_match_log_softmax_gather_with_padding():
    model = small_model("gqa")
    input_ids, labels = random_batch(3, 14)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    labels[1, 9:] = -100
    got = model.token_log_probs(input_ids, labels, attention_mask)
    logits = model(input_ids, attention_mask=attention_mask).logits
    expected = logits.log_softmax(-1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    expected = expected.masked_fill(labels == -100, 0.0)
    assert got.shape == labels.shape and torch.allclose(got, expected, atol=1e-5)
    weights = torch.randn_like(got)  # DPO-style: a different weight per token
    grad_got = torch.autograd.grad((got * weights).sum(), model.lm_head.weight)[0]
    grad_expected = torch.autograd.grad((expected * weights).sum(), model.lm_head.weight)[0]
    assert torch.allclose(grad_got, grad_expected, atol=1e-5)


def test_num_flops_per_token_formula():
    for tie in (True, False):
        config = small_config("gqa", tie_word_embeddings=tie)
        model = Z2allForCausalLM(config)
        # Count matmul weights directly from the modules: every Linear (lm_head included).
        linear_params = sum(m.weight.numel() for m in model.modules()
                            if isinstance(m, torch.nn.Linear))
        norm_params = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
        attention = 12 * config.num_hidden_layers * config.hidden_size * 40
        assert model.num_flops_per_token(40) == 6 * (linear_params + norm_params) + attention


def test_config_presets_padding_and_json(tmp_path):
    for name in PRESETS:
        config = Z2allConfig.from_preset(name)
        assert config.vocab_size % 64 == 0 and config.intermediate_size % 64 == 0
    config = Z2allConfig.from_preset("tiny", vocab_size=1000, dropout=0.1)
    assert config.vocab_size == 1024 and config.dropout == 0.1
    assert Z2allConfig(hidden_size=96, num_attention_heads=4).intermediate_size == 256
    config.to_json_file(tmp_path / "config.json")
    assert Z2allConfig.from_json_file(tmp_path / "config.json") == config
    values = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "bad.json").write_text(json.dumps({**values, "hiden_size": 3}))
    with pytest.raises(ValueError, match=r"bad\.json.*hiden_size"):
        Z2allConfig.from_json_file(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="unknown model preset"):
        Z2allConfig.from_preset("7B")
    with pytest.raises(ValueError, match="num_key_value_heads"):
        Z2allConfig(num_attention_heads=12, num_key_value_heads=5)


def test_convert_to_hf_cli_from_a_run_dir(tmp_path, tiny_hf_tokenizer_dir):
    from transformers import AutoTokenizer, LlamaForCausalLM

    from utils.checkpoint import save_checkpoint

    model = small_model("gqa", vocab_size=512).eval()
    save_checkpoint(tmp_path / "run" / "ckpt", 5, model.save_pretrained)
    convert_main(["--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "hf"),
                  "--tokenizer_dir", str(tiny_hf_tokenizer_dir)])
    hf_model = LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")  # no remote code needed
    assert hf_model.config.eos_token_id == tokenizer.eos_token_id == len(tokenizer) - 3
    input_ids = torch.randint(0, 512, (2, 8))
    with torch.no_grad():
        assert (hf_model(input_ids).logits - model(input_ids).logits).abs().max() <= 1e-5


@pytest.mark.parametrize("mode", ["bf16 params", "bf16 autocast"])
def test_low_precision_training_step_tracks_fp32(mode):
    """bf16 weights (the mixed-precision optimizer keeps fp32 masters) or fp32 weights under
    autocast: loss and grads stay close to fp32, grads have the parameters' dtype."""
    input_ids, labels = random_batch(2, 16)
    reference = small_model("gqa")
    expected = _grads(reference, input_ids, labels)
    expected_loss = reference(input_ids, labels=labels).loss
    model = small_model("gqa")
    if mode == "bf16 params":
        model = model.to(torch.bfloat16)
        grads = _grads(model, input_ids, labels)
        loss = model(input_ids, labels=labels).loss
    else:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            grads = _grads(model, input_ids, labels)
            loss = model(input_ids, labels=labels).loss
    assert loss.dtype == torch.float32
    assert torch.allclose(loss, expected_loss, rtol=2e-2)
    for name, param in model.named_parameters():
        assert grads[name].dtype == param.dtype, name
        scale = expected[name].abs().max()
        assert (grads[name].float() - expected[name]).abs().max() <= 0.1 * scale, name


def test_kernel_choice_is_logged_once_with_the_reason(caplog, monkeypatch):
    from model import modeling_z2all

    monkeypatch.setattr(modeling_z2all, "_logged_kernel_choices", set())
    absent = OptionalImport(None, "flash_attn not installed")
    monkeypatch.setattr(kernels, "gpu_kernels", kernels.GpuKernels(
        absent, absent, absent, absent, OptionalImport(None, "import failed: bad build")))
    model = small_model("gqa")
    input_ids, labels = random_batch(1, 8)
    with caplog.at_level("INFO", logger="model.modeling_z2all"):
        model(input_ids, labels=labels)
        model(input_ids)
    lines = [r.getMessage() for r in caplog.records if "model kernels" in r.getMessage()]
    assert lines == ["model kernels on cpu/float32: "
                     "attention=torch-sdpa (flash_attn not installed), "
                     "rms_norm=torch-fp32 (import failed: bad build), "
                     "rotary=torch (flash_attn not installed), "
                     "swiglu=torch (flash_attn not installed), cross_entropy=chunked-torch"]


class _ParamReadsOutsideOwner(TorchFunctionMode):
    """Records every torch op that reads a parameter while none of the modules owning it is
    inside its forward (forward pre/post hooks keep the stack of running modules)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.owners: dict[torch.nn.Parameter, set[torch.nn.Module]] = {}
        for module in model.modules():
            for param in module.parameters(recurse=False):
                self.owners.setdefault(param, set()).add(module)
        self.running: list[torch.nn.Module] = []
        self.outside: set[str] = set()
        self.names = {param: name for name, param in model.named_parameters()}
        for module in model.modules():
            module.register_forward_pre_hook(self._enter)
            module.register_forward_hook(self._leave, always_call=True)

    def _enter(self, module: torch.nn.Module, args) -> None:
        self.running.append(module)

    def _leave(self, module: torch.nn.Module, args, output) -> None:
        self.running.pop()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") != "__get__":  # metadata (.shape, .dtype) is fine
            for value in (*args, *kwargs.values()):
                owners = self.owners.get(value) if isinstance(value, torch.nn.Parameter) else None
                if owners and not owners & set(self.running):
                    self.outside.add(self.names[value])
        return func(*args, **kwargs)


@pytest.mark.parametrize("tie", [True, False])
def test_parameters_are_read_only_inside_their_own_module_forward(tie):
    """The contract of module hooks (ZeRO-1's overlapped param all-gather waits for a parameter
    in its module's forward pre-hook): a weight read from outside that forward, like an untied
    lm_head.weight handed to the fused loss by the parent, could be read half-gathered."""
    model = small_model("gqa", tie_word_embeddings=tie)
    input_ids, labels = random_batch(2, 12)
    mask = torch.ones_like(input_ids)
    mask[0, -3:] = 0
    checker = _ParamReadsOutsideOwner(model)
    with checker:
        model(input_ids, labels=labels).loss.backward()
        model(input_ids, attention_mask=mask)
        model.token_log_probs(input_ids, labels, attention_mask=mask).sum().backward()
    assert len(checker.owners) == len(list(model.parameters()))
    assert checker.outside == set(), sorted(checker.outside)


@pytest.mark.slow  # torch.compile's work is one core's: it runs in the lane beside the others
def test_compiled_blocks_give_the_eager_loss_and_grads():
    """`--compile`: torch.compile per decoder block changes speed, not results (and not the
    parameter names a checkpoint stores)."""
    eager, compiled = small_model("gqa", num_hidden_layers=1), small_model("gqa",
                                                                          num_hidden_layers=1)
    compiled.compile_blocks()
    input_ids, labels = random_batch(2, 8)
    expected, got = _grads(eager, input_ids, labels), _grads(compiled, input_ids, labels)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    for name, grad in got.items():
        assert torch.allclose(grad, expected[name], atol=1e-5), name


def test_context_parallelism_is_switched_through_the_model_only():
    """`use_sequence_shard` turns it on, `whole_sequences` off for a while (restored even on an
    error), and no code outside model/ sets the model's attribute itself: a reader of the model
    finds every way it can change."""
    model, shard = small_model(), object()
    assert model.model.sequence_shard is None
    model.use_sequence_shard(shard)
    with pytest.raises(RuntimeError), model.whole_sequences():
        assert model.model.sequence_shard is None
        raise RuntimeError
    assert model.model.sequence_shard is shard
    repo = Path(__file__).resolve().parents[2]
    setter = re.compile(r"\.model\.(sequence_shard|context_parallel)\s*=[^=]")
    folders = ("trainer", "parallel", "parallel_plan", "bench", "tests", "tools")
    outside = [path for folder in folders for path in (repo / folder).rglob("*.py")
               if setter.search(path.read_text())]
    assert outside == []
