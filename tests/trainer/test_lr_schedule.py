"""LR schedule vs the formulas written out independently, at random settings."""

from __future__ import annotations

import math
import random

import pytest

from trainer.lr_schedule import LRSchedule


def _settings(seed):
    rng = random.Random(seed)
    lr = rng.uniform(1e-4, 1e-2)
    return dict(lr=lr, min_lr=lr * rng.uniform(0.0, 0.5), warmup_iters=rng.randint(1, 20),
                max_iters=rng.randint(40, 200))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("kind", ["cosine", "linear", "constant"])
def test_matches_formula(seed, kind):
    s = _settings(seed)
    schedule = LRSchedule(**s, kind=kind)
    lr, min_lr, warmup, horizon = s["lr"], s["min_lr"], s["warmup_iters"], s["max_iters"]
    for step in range(horizon + 10):
        if step < warmup:
            expected = lr * (step + 1) / warmup
        elif kind == "constant":
            expected = lr
        elif step >= horizon:
            expected = min_lr
        else:
            t = (step - warmup) / (horizon - warmup)
            shape = (1 + math.cos(math.pi * t)) / 2 if kind == "cosine" else 1 - t
            expected = min_lr + shape * (lr - min_lr)
        assert schedule(step) == pytest.approx(expected, rel=1e-12), step


def test_shape_properties():
    schedule = LRSchedule(lr=1e-3, min_lr=1e-4, warmup_iters=10, max_iters=100)
    values = [schedule(s) for s in range(120)]
    assert values[0] > 0 and values[9] == pytest.approx(1e-3)
    assert all(a <= b for a, b in zip(values[:10], values[1:10]))           # warmup rises
    assert all(a >= b for a, b in zip(values[10:], values[11:]))            # decay falls
    assert values[-1] == pytest.approx(1e-4)


def test_no_warmup_and_bad_settings():
    assert LRSchedule(lr=1.0, min_lr=0.0, warmup_iters=0, max_iters=10)(0) == 1.0
    with pytest.raises(ValueError, match="cosine"):
        LRSchedule(lr=1.0, min_lr=0.0, warmup_iters=0, max_iters=10, kind="step")
    with pytest.raises(ValueError, match="min_lr"):
        LRSchedule(lr=1.0, min_lr=2.0, warmup_iters=0, max_iters=10)
