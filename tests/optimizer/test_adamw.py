"""optimizer/adamw.py: a checkpoint saved by any AdamW implementation resumes in any other.

apex FusedAdam (the emulation in tests/fake_gpu_libs), torch AdamW fused, foreach and the
for-loop: each pair runs 3 steps with the first, saves, resumes with the second for 2 more
steps, and must land where 5 uninterrupted steps of the first land. A restarted bias
correction (step counted from 0 again) or lost moments would miss by ~lr.
"""

from __future__ import annotations

import io

import pytest
import torch

from optimizer import adamw
from optimizer.optimizer import FP32Optimizer
from optimizer.optimizer_config import OptimizerConfig
from tests import fake_gpu_libs
from tests.optimizer.helpers import OneProcessDDP, TinyNet, loss_fn, random_batches
from utils import gpu_libraries

HYPER = dict(lr=0.1, betas=(0.9, 0.95), eps=1e-8)


def _apex(groups):
    from apex.optimizers import FusedAdam  # the fake, installed by the test

    return FusedAdam([group for group in groups if group["params"]], adam_w_mode=True, **HYPER)


IMPLEMENTATIONS = {
    "apex-fused": _apex,
    "torch-fused": lambda groups: torch.optim.AdamW(groups, fused=True, **HYPER),
    "torch-foreach": lambda groups: torch.optim.AdamW(groups, foreach=True, **HYPER),
    "torch-for-loop": lambda groups: torch.optim.AdamW(groups, foreach=False, **HYPER),
}


@pytest.fixture
def emulated_apex(monkeypatch):
    fake_gpu_libs.install(monkeypatch)
    monkeypatch.setattr(gpu_libraries, "KERNEL_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(adamw, "apex_fused_adam",
                        gpu_libraries.import_optional("apex.optimizers", "FusedAdam"))


def _groups(values):
    params = [torch.nn.Parameter(value.clone()) for value in values]
    return [{"params": params[:1], "weight_decay": 0.1},
            {"params": params[1:], "weight_decay": 0.0},
            {"params": [], "weight_decay": 0.0}]  # a ZeRO-1 shard's empty group


def _steps(optimizer, first, count):
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for step in range(first, first + count):
        for p in params:
            p.grad = torch.sin(p.detach() * (step + 1)) + 0.1 * step
        optimizer.step()
    return params


def _through_a_file(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("resumed_by", list(IMPLEMENTATIONS))
@pytest.mark.parametrize("saved_by", list(IMPLEMENTATIONS))
def test_adam_state_resumes_in_every_implementation(emulated_apex, saved_by, resumed_by):
    values = [torch.randn(4, 6), torch.randn(6)]
    expected = _steps(IMPLEMENTATIONS[saved_by](_groups(values)), 0, 5)

    first = IMPLEMENTATIONS[saved_by](_groups(values))
    halfway = _steps(first, 0, 3)
    state = _through_a_file(adamw.adam_state_dict(first))
    assert state["step"] == [3, 3]
    second = IMPLEMENTATIONS[resumed_by](_groups([p.detach() for p in halfway]))
    adamw.load_adam_state_dict(second, state)
    got = _steps(second, 3, 2)
    for p, q in zip(got, expected, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
    assert [adamw.read_adam_state(second, p)[2] for p in got] == [5, 5]


def test_load_refuses_a_state_for_other_tensors():
    optimizer = IMPLEMENTATIONS["torch-foreach"](_groups([torch.randn(4, 6), torch.randn(6)]))
    state = adamw.adam_state_dict(optimizer)
    other = IMPLEMENTATIONS["torch-foreach"](_groups([torch.randn(4, 5), torch.randn(6)]))
    with pytest.raises(ValueError, match="the model changed"):
        adamw.load_adam_state_dict(other, state)
    with pytest.raises(ValueError, match="holds 2 tensors, this optimizer 1"):
        adamw.load_adam_state_dict(torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))]), state)


def _train(optimizer, ddp, batches):
    for batch in batches:
        optimizer.zero_grad()
        loss_fn(ddp, batch).backward()
        ddp.finish_grad_sync()
        optimizer.step()


def test_checkpoint_from_a_node_with_apex_resumes_on_one_without(emulated_apex, monkeypatch,
                                                                  tmp_path):
    """The wrapper's checkpoint file: apex FusedAdam -> torch AdamW (was `KeyError: 'step'`)."""
    config = OptimizerConfig(lr=0.05, weight_decay=0.1, clip_grad=0.0)
    batches = random_batches(5, 8, seed=1)
    torch.manual_seed(0)
    reference_model = TinyNet()
    model = TinyNet()
    model.load_state_dict(reference_model.state_dict())
    reference_ddp, ddp = OneProcessDDP(reference_model), OneProcessDDP(model)
    reference = FP32Optimizer(config, reference_ddp)
    assert type(reference.inner).__name__ == "FusedAdam"
    _train(reference, reference_ddp, batches)

    with_apex = FP32Optimizer(config, ddp)
    _train(with_apex, ddp, batches[:3])
    with_apex.save_checkpoint(tmp_path)
    monkeypatch.setattr(adamw, "apex_fused_adam", gpu_libraries.OptionalImport(None, "absent"))
    without_apex = FP32Optimizer(config, ddp)
    assert isinstance(without_apex.inner, torch.optim.AdamW)
    without_apex.load_checkpoint(tmp_path)
    _train(without_apex, ddp, batches[3:])
    for p, q in zip(model.parameters(), reference_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
