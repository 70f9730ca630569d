"""warm-up off by one: the first update gets lr 0.

Step s of warm-up uses lr * (s + 1) / warmup_iters, so the first update already moves the
weights and step warmup_iters - 1 reaches the peak (the module docstring).
"""

from __future__ import annotations

import math


def __call__(self, step: int) -> float:
    if step < self.warmup_iters:
        return self.lr * step / self.warmup_iters
    if self.kind == "constant":
        return self.lr
    decay_steps = self.max_iters - self.warmup_iters
    if decay_steps <= 0 or step >= self.max_iters:
        return self.min_lr if decay_steps > 0 else self.lr
    progress = (step - self.warmup_iters) / decay_steps
    if self.kind == "cosine":
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        factor = 1.0 - progress
    return self.min_lr + factor * (self.lr - self.min_lr)
