"""the decay ends at 0, not at min_lr.

The cosine runs from lr down to min_lr: min_lr + factor * (lr - min_lr), and min_lr is kept
after max_iters.
"""

from __future__ import annotations

import math


def __call__(self, step: int) -> float:
    if step < self.warmup_iters:
        return self.lr * (step + 1) / self.warmup_iters
    if self.kind == "constant":
        return self.lr
    decay_steps = self.max_iters - self.warmup_iters
    if decay_steps <= 0 or step >= self.max_iters:
        return 0.0 if decay_steps > 0 else self.lr
    progress = (step - self.warmup_iters) / decay_steps
    if self.kind == "cosine":
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        factor = 1.0 - progress
    return factor * self.lr
