"""Learning-rate schedule: linear warmup, then cosine | linear | constant decay to `min_lr`.

A pure function of the step and the run's options: a checkpoint stores no scheduler state, only
the step and the config. A resume that changes the schedule's options is reported by
trainer/config_files.py (the saved config.json vs the command line).

    lr
    ^      ____
    |     /    `--.__            cosine: min_lr + ½(1 + cos(π·progress))·(lr − min_lr)
    |    /           `--.__      (Loshchilov & Hutter 2017, SGDR, without restarts)
    |   /                  `---________ min_lr
    |  /
    +--|----|-------------------|---------> step
       0  warmup_iters       max_iters

Step s (0-based: the s-th optimizer update) in warmup uses lr·(s+1)/warmup_iters, so the very
first update is already non-zero and step warmup_iters−1 reaches the peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

ScheduleKind = Literal["cosine", "linear", "constant"]


@dataclass(frozen=True)
class LRSchedule:
    lr: float                  # peak learning rate, reached at the end of warmup
    min_lr: float              # floor of the decay (kept after max_iters)
    warmup_iters: int          # linear ramp length in optimizer steps
    max_iters: int             # the horizon: decay ends here
    kind: ScheduleKind = "cosine"

    def __post_init__(self) -> None:
        if self.kind not in ("cosine", "linear", "constant"):
            raise ValueError(f"lr_schedule must be cosine|linear|constant, got {self.kind!r}")
        if self.warmup_iters < 0 or self.max_iters < 0:
            raise ValueError("warmup_iters and max_iters must be >= 0")
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")

    def __call__(self, step: int) -> float:
        if step < self.warmup_iters:
            return self.lr * (step + 1) / self.warmup_iters
        if self.kind == "constant":
            return self.lr
        decay_steps = self.max_iters - self.warmup_iters
        if decay_steps <= 0 or step >= self.max_iters:
            return self.min_lr if decay_steps > 0 else self.lr
        progress = (step - self.warmup_iters) / decay_steps  # in [0, 1)
        if self.kind == "cosine":
            factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            factor = 1.0 - progress
        return self.min_lr + factor * (self.lr - self.min_lr)
