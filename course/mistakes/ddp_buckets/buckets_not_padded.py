"""buckets not padded to a multiple of the world size.

A reduce-scatter gives each of the W ranks an equal slice of a bucket (ZeRO-1's shards), so
every bucket's length must divide by W: pad its end (pad_to_multiple).
"""

from __future__ import annotations

from torch.nn import Parameter


def plan_layout(params: list[Parameter], bucket_size: int | None, world_size: int,
                ) -> tuple[dict[Parameter, tuple[int, int, int]], list[tuple[int, int]]]:
    param_index_map: dict[Parameter, tuple[int, int, int]] = {}
    bucket_ranges: list[tuple[int, int]] = []
    bucket_start = next_free = 0
    for position, param in enumerate(reversed(params)):
        param_index_map[param] = (next_free, next_free + param.numel(), len(bucket_ranges))
        next_free += param.numel()
        is_last_param = position == len(params) - 1
        bucket_is_full = bucket_size is not None and next_free - bucket_start >= bucket_size
        if bucket_is_full or is_last_param:
            bucket_ranges.append((bucket_start, next_free))
            bucket_start = next_free
    return param_index_map, bucket_ranges
