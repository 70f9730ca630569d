"""the piece not cut at the shard's end.

A parameter may run past the end of this rank's shard: its piece ends at min(end, shard_end), or
two ranks would both update the same elements.
"""

from __future__ import annotations


def overlaps_with_shard(ranges: list[tuple[int, int]], shard_start: int, shard_end: int
                        ) -> list[tuple[int, int, int]]:
    overlaps = []
    for index, (start, end) in enumerate(ranges):
        if start < shard_end and end > shard_start:
            overlaps.append((index, max(start, shard_start), end))
    return overlaps
