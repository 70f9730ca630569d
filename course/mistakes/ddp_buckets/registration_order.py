"""parameters placed in registration order instead of reversed.

Backward produces the last layer's gradients first: buckets are filled from the last parameter,
so the first bucket is complete (and its all-reduce can start) while backward is still running.
"""

from __future__ import annotations

from torch.nn import Parameter

from parallel.distributed_data_parallel.param_and_grad_buffer import pad_to_multiple


def plan_layout(params: list[Parameter], bucket_size: int | None, world_size: int,
                ) -> tuple[dict[Parameter, tuple[int, int, int]], list[tuple[int, int]]]:
    param_index_map: dict[Parameter, tuple[int, int, int]] = {}
    bucket_ranges: list[tuple[int, int]] = []
    bucket_start = next_free = 0
    for position, param in enumerate(params):
        param_index_map[param] = (next_free, next_free + param.numel(), len(bucket_ranges))
        next_free += param.numel()
        is_last_param = position == len(params) - 1
        bucket_is_full = bucket_size is not None and next_free - bucket_start >= bucket_size
        if bucket_is_full or is_last_param:
            bucket_end = pad_to_multiple(next_free, world_size)
            bucket_ranges.append((bucket_start, bucket_end))
            bucket_start = next_free = bucket_end
    return param_index_map, bucket_ranges
