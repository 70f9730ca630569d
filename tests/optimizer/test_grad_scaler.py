"""DynamicGradScaler against torch's own loss-scale update kernel (torch.amp.GradScaler's)."""

from __future__ import annotations

import random

import pytest
import torch

from optimizer.grad_scaler import DynamicGradScaler


def torch_scale_sequence(found_infs: list[bool], initial: float, interval: int) -> list[float]:
    """Reference: `torch._amp_update_scale_`, the op behind torch.amp.GradScaler.update()."""
    scale = torch.full((1,), initial)
    growth_tracker = torch.zeros(1, dtype=torch.int32)
    scales = []
    for found_inf in found_infs:
        torch._amp_update_scale_(scale, growth_tracker, torch.full((1,), float(found_inf)),
                                 2.0, 0.5, interval)
        scales.append(float(scale))
    return scales


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_without_hysteresis_matches_torch_grad_scaler(seed):
    rng = random.Random(seed)
    found_infs = [rng.random() < 0.15 for _ in range(200)]
    scaler = DynamicGradScaler(2.0**16, min_scale=2.0**-30, growth_interval=7, hysteresis=1)
    ours = []
    for found_inf in found_infs:
        scaler.update(found_inf)
        ours.append(scaler.scale)
    assert ours == torch_scale_sequence(found_infs, 2.0**16, 7)
    assert len(set(ours)) > 3  # it both grew and backed off


def test_hysteresis_tolerates_overflows_until_the_budget_is_spent():
    scaler = DynamicGradScaler(1024.0, growth_interval=4, hysteresis=2)
    scaler.update(True)
    assert scaler.scale == 1024.0  # first overflow: tolerated (step still skipped by caller)
    scaler.update(False)
    scaler.update(True)
    assert scaler.scale == 512.0  # second overflow since the last growth: back off
    scaler.update(True)
    assert scaler.scale == 256.0  # budget stays spent until the scale grows again
    for _ in range(4):
        scaler.update(False)
    assert scaler.scale == 512.0 and scaler.hysteresis_left == 2  # growth refills the budget


def test_min_scale_bounds_backoff_and_state_round_trips():
    scaler = DynamicGradScaler(4.0, min_scale=1.0, growth_interval=3, hysteresis=1)
    for _ in range(5):
        scaler.update(True)
    assert scaler.scale == 1.0
    scaler.update(False)
    restored = DynamicGradScaler(99.0, growth_interval=3, hysteresis=1)
    restored.load_state_dict(scaler.state_dict())
    for found_inf in [False, False, True, False]:
        scaler.update(found_inf)
        restored.update(found_inf)
        assert restored.state_dict() == scaler.state_dict()
    with pytest.raises(KeyError, match="scale"):
        restored.load_state_dict({"scale": 2.0})
