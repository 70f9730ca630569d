"""empty pieces kept (a parameter that only touches the shard's edge).

Intervals are half-open: [start, end) and [shard_start, shard_end) meet only if low < high; with
<= a parameter ending exactly at the shard's start gives a piece of 0 elements.
"""

from __future__ import annotations


def overlaps_with_shard(ranges: list[tuple[int, int]], shard_start: int, shard_end: int
                        ) -> list[tuple[int, int, int]]:
    overlaps = []
    for index, (start, end) in enumerate(ranges):
        low, high = max(start, shard_start), min(end, shard_end)
        if low <= high:
            overlaps.append((index, low, high))
    return overlaps
