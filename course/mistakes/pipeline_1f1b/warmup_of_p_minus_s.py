"""one warm-up forward too many: P-s instead of P-s-1.

Stage s's first backward can start once the P-s-1 stages below it have forwarded its first
micro-batch; one more warm-up forward makes stage s hold P-s+1 micro-batches' activations (the
last stage then holds 2 instead of 1), which is the memory 1f1b exists to save.
"""

from __future__ import annotations

from parallel.pipeline_parallel.schedules import Action


def one_forward_one_backward_order(stages: int, stage: int, micro_batches: int) -> list[Action]:
    warmup = min(stages - stage, micro_batches)
    order: list[Action] = [("F", index) for index in range(warmup)]
    for index in range(warmup, micro_batches):
        order += [("F", index), ("B", index - warmup)]
    order += [("B", index) for index in range(micro_batches - warmup, micro_batches)]
    return order
