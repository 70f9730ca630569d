"""Our FP32 / Float16 wrappers against torch AdamW + clip_grad_norm_ (single process)."""

from __future__ import annotations

import copy

import pytest
import torch

from optimizer import OptimizerConfig, get_optimizer
from optimizer.optimizer import Float16OptimizerWithFloat16Params, FP32Optimizer
from tests.optimizer.helpers import (
    OneProcessDDP,
    TinyNet,
    loss_fn,
    random_batches,
    reference_adamw,
    reference_step,
)
from utils.precision import DTYPES


def make_config(params_dtype: str = "fp32", **overrides) -> OptimizerConfig:
    settings = dict(lr=3e-2, weight_decay=0.1, clip_grad=0.3, params_dtype=params_dtype,
                    loss_scale_window=2, hysteresis=1, initial_loss_scale=2.0**10)
    settings.update(overrides)
    return OptimizerConfig(**settings)


def our_step(ddp: OneProcessDDP, optimizer, batch) -> tuple[float, bool, float]:
    optimizer.zero_grad()
    loss = loss_fn(ddp, batch)
    optimizer.scale_loss(loss).backward()
    ddp.finish_grad_sync()
    stepped, grad_norm = optimizer.step()
    return loss.item(), stepped, grad_norm


def test_factory_picks_the_wrapper_and_checks_dtype():
    for dtype, cls in [("fp32", FP32Optimizer), ("bf16", Float16OptimizerWithFloat16Params)]:
        ddp = OneProcessDDP(TinyNet().to(DTYPES[dtype]))
        assert type(get_optimizer(make_config(dtype), ddp)) is cls
    with pytest.raises(ValueError, match="params_dtype=bf16"):
        get_optimizer(make_config("bf16"), OneProcessDDP(TinyNet()))


def test_fp32_optimizer_matches_torch_adamw_with_clipping():
    torch.manual_seed(0)
    config = make_config("fp32")
    model = TinyNet()
    reference = copy.deepcopy(model)
    ddp = OneProcessDDP(model)
    optimizer = get_optimizer(config, ddp)
    reference_optimizer = reference_adamw(reference, config)
    norms = []
    for batch in random_batches(6, 32, seed=1):
        _, stepped, grad_norm = our_step(ddp, optimizer, batch)
        expected_norm = reference_step(reference, reference_optimizer, batch, config.clip_grad)
        assert stepped
        assert grad_norm == pytest.approx(expected_norm, rel=1e-6)
        norms.append(grad_norm)
    assert max(norms) > config.clip_grad  # clipping was exercised
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("params_dtype", ["bf16", "fp16"])
def test_float16_main_params_follow_adamw_on_the_same_gradients(params_dtype):
    """fp32 main params == torch AdamW fed each step with the (unscaled) 16-bit model's
    gradients; the model params are exactly the main params rounded to 16 bits."""
    torch.manual_seed(0)
    config = make_config(params_dtype)
    model = TinyNet().to(DTYPES[params_dtype])
    reference = TinyNet()
    reference.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    ddp = OneProcessDDP(model)
    optimizer = get_optimizer(config, ddp)
    reference_optimizer = reference_adamw(reference, config)
    for batch in random_batches(5, 32, seed=2):
        batch = (batch[0].to(DTYPES[params_dtype]), batch[1])
        loss_scale = optimizer.loss_scale
        _, stepped, grad_norm = our_step(ddp, optimizer, batch)
        assert stepped
        for ref_param, param in zip(reference.parameters(), model.parameters()):
            ref_param.grad = param.main_grad.float() / loss_scale
        expected_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), config.clip_grad)
        reference_optimizer.step()
        assert grad_norm == pytest.approx(float(expected_norm), rel=1e-5)
    for main, ref_param, param in zip(optimizer.main_params, reference.parameters(),
                                      model.parameters()):
        torch.testing.assert_close(main, ref_param.detach(), rtol=1e-6, atol=1e-7)
        assert torch.equal(param, main.to(param.dtype))


def test_bf16_training_tracks_fp32_training():
    """Same init and data: bf16 params + fp32 main params stay within 3% of fp32's loss."""
    torch.manual_seed(0)
    config = make_config("fp32", clip_grad=1.0, lr=1e-2)
    fp32_model = TinyNet()
    bf16_model = copy.deepcopy(fp32_model).to(torch.bfloat16)
    fp32_ddp, bf16_ddp = OneProcessDDP(fp32_model), OneProcessDDP(bf16_model)
    fp32_opt = get_optimizer(config, fp32_ddp)
    bf16_opt = get_optimizer(make_config("bf16", clip_grad=1.0, lr=1e-2), bf16_ddp)
    fp32_losses, bf16_losses = [], []
    for inputs, targets in random_batches(30, 64, seed=3):
        fp32_losses.append(our_step(fp32_ddp, fp32_opt, (inputs, targets))[0])
        bf16_losses.append(our_step(bf16_ddp, bf16_opt, (inputs.bfloat16(), targets))[0])
    assert fp32_losses[-1] < 0.9 * fp32_losses[0]  # it learned something
    for fp32_loss, bf16_loss in zip(fp32_losses, bf16_losses):
        assert abs(bf16_loss - fp32_loss) <= 0.03 * fp32_loss


def test_fp16_overflow_skips_step_and_backs_off_then_scale_grows():
    torch.manual_seed(0)
    config = make_config("fp16", loss_scale_window=3, hysteresis=1)
    model = TinyNet().half()
    ddp = OneProcessDDP(model)
    optimizer = get_optimizer(config, ddp)
    initial_scale = optimizer.loss_scale
    before = [p.detach().clone() for p in model.parameters()]
    for param in model.parameters():
        param.main_grad.copy_(torch.randn_like(param.main_grad))
    model.out.weight.main_grad[1, 2] = float("inf")
    stepped, grad_norm = optimizer.step()
    assert not stepped and grad_norm != grad_norm  # NaN: no norm for a skipped step
    assert optimizer.loss_scale == initial_scale * 0.5
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert len(optimizer.inner.state) == 0  # Adam's moments were not touched either
    for batch in random_batches(3, 16, seed=4):
        _, stepped, _ = our_step(ddp, optimizer, (batch[0].half(), batch[1]))
        assert stepped
    assert optimizer.loss_scale == initial_scale * 0.5 * 2.0  # grew after the 3-step window
    assert not all(torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_nonfinite_gradient_is_skipped_without_a_scaler():
    model = TinyNet()
    ddp = OneProcessDDP(model)
    optimizer = get_optimizer(make_config("fp32"), ddp)
    before = [p.detach().clone() for p in model.parameters()]
    for param in model.parameters():
        param.main_grad.copy_(torch.randn_like(param))
    model.gain.main_grad[0] = float("nan")
    stepped, _ = optimizer.step()
    assert not stepped
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))


@pytest.mark.parametrize("params_dtype", ["fp32", "bf16", "fp16"])
def test_checkpoint_resume_equals_uninterrupted_run(tmp_path, params_dtype):
    torch.manual_seed(0)
    config = make_config(params_dtype)
    dtype = DTYPES[params_dtype]
    batches = [(x.to(dtype), y) for x, y in random_batches(6, 16, seed=5)]
    initial = TinyNet().to(dtype)

    straight = copy.deepcopy(initial)
    straight_ddp = OneProcessDDP(straight)
    straight_opt = get_optimizer(config, straight_ddp)
    for batch in batches:
        our_step(straight_ddp, straight_opt, batch)

    first = copy.deepcopy(initial)
    first_ddp = OneProcessDDP(first)
    first_opt = get_optimizer(config, first_ddp)
    for batch in batches[:3]:
        our_step(first_ddp, first_opt, batch)
    first_opt.save_checkpoint(tmp_path / "optim")
    resumed = copy.deepcopy(initial)
    resumed.load_state_dict(first.state_dict())  # what the model checkpoint restores
    resumed_ddp = OneProcessDDP(resumed)
    resumed_opt = get_optimizer(config, resumed_ddp)
    resumed_opt.load_checkpoint(tmp_path / "optim")
    assert resumed_opt.loss_scale == first_opt.loss_scale
    for batch in batches[3:]:
        our_step(resumed_ddp, resumed_opt, batch)
    for ours, theirs in zip(resumed.parameters(), straight.parameters()):
        assert torch.equal(ours, theirs)
    assert resumed_opt.loss_scale == straight_opt.loss_scale


def test_loading_another_kinds_state_fails_loudly():
    fp32_opt = get_optimizer(make_config("fp32"), OneProcessDDP(TinyNet()))
    bf16_opt = get_optimizer(make_config("bf16"), OneProcessDDP(TinyNet().bfloat16()))
    with pytest.raises(ValueError, match="Float16OptimizerWithFloat16Params"):
        bf16_opt.load_state_dict(fp32_opt.state_dict())
