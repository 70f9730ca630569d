"""the same warm-up on every stage: P-1 forwards regardless of s.

Only stage 0 waits P-1 slots for its first gradient; stage s waits P-s-1. The last stage
runs each backward right after its forward (F0 B0 F1 B1 ...), so it holds one micro-batch.
"""

from __future__ import annotations

from parallel.pipeline_parallel.schedules import Action


def one_forward_one_backward_order(stages: int, stage: int, micro_batches: int) -> list[Action]:
    warmup = min(stages - 1, micro_batches)
    order: list[Action] = [("F", index) for index in range(warmup)]
    for index in range(warmup, micro_batches):
        order += [("F", index), ("B", index - warmup)]
    order += [("B", index) for index in range(micro_batches - warmup, micro_batches)]
    return order
