"""Which pieces of which parameters fall into this rank's ZeRO-1 shard of a bucket.

DDP lays every parameter out in a flat grad buffer (and, for ZeRO-1, a flat param buffer with
the same layout), cut into buckets whose sizes divide by the data-parallel world size W. ZeRO-1
cuts each bucket into W equal contiguous shards; rank r owns shard r: it receives only that
shard's averaged gradient (reduce-scatter), keeps fp32 main params and Adam state only for it,
updates it, and all-gathers the updated shards so that every rank has the whole model again.

Shard boundaries ignore parameter boundaries, so one parameter can straddle two (or more)
shards. AdamW is element-wise (every element's update reads only its own gradient and moments),
so each rank can update its *pieces* of parameters independently and the result is exactly the
full-parameter update.

Worked example: a bucket of 16 elements over W = 4 ranks (shard size 16 / 4 = 4). The bucket
holds a (6 elements), b (4), c (5) and one element of padding (DDP pads the bucket to 16):

    bucket index   0 1 2 3 | 4 5 6 7 | 8 9 10 11 | 12 13 14 15
    holds          a a a a | a a b b | b b c  c  | c  c  c  pad
    owner          rank 0  | rank 1  | rank 2    | rank 3

    rank 0:  a[0:4] -> shard[0:4]
    rank 1:  a[4:6] -> shard[0:2],  b[0:2] -> shard[2:4]       (a and b straddle shards)
    rank 2:  b[2:4] -> shard[0:2],  c[0:2] -> shard[2:4]
    rank 3:  c[2:5] -> shard[0:3]                              (shard[3] is padding: no piece)

Indices into a parameter are into its flattened view, `param.view(-1)[param_start:param_end]`.
Every element of every parameter belongs to exactly one piece on exactly one rank, which is what
lets the gradient norm be a sum of per-rank partial sums, and a checkpoint be re-cut for a
different W (a piece is addressed by parameter name and element range, not by rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.nn import Parameter


@dataclass(frozen=True)
class ShardPiece:
    """The part of one parameter that lies inside this rank's shard of one bucket."""

    param: Parameter
    name: str
    param_start: int
    """Start of the piece in the flattened parameter."""
    param_end: int
    shard_start: int
    """Where the piece starts inside this rank's shard (0 .. shard size)."""
    shard_end: int

    @property
    def numel(self) -> int:
        return self.param_end - self.param_start


def shard_range(bucket: Any, rank: int, world_size: int) -> tuple[int, int]:
    """Bucket-relative [start, end) of rank `rank`'s shard, i.e. `grad_data.view(W, -1)[rank]`."""
    shard_size = bucket.grad_data.numel() // world_size
    return rank * shard_size, (rank + 1) * shard_size


def overlaps_with_shard(ranges: list[tuple[int, int]], shard_start: int, shard_end: int
                        ) -> list[tuple[int, int, int]]:
    """(index, low, high) for each [start, end) of `ranges` that meets the shard
    [shard_start, shard_end), [low, high) being the common part; all in the flat coordinates
    of one bucket or ZeRO-2/3 unit. The one interval cut behind every shard map: ZeRO-1's
    buckets (below), ZeRO-2/3's units (optimizer/sharded_optimizer.py) and the memory plan."""
    overlaps = []
    for index, (start, end) in enumerate(ranges):
        low, high = max(start, shard_start), min(end, shard_end)
        if low < high:
            overlaps.append((index, low, high))
    return overlaps


def pieces_in_range(params: list[Parameter], names: list[str], ranges: list[tuple[int, int]],
                    shard_start: int, shard_end: int) -> list[ShardPiece]:
    """The pieces of `params` (at flat `ranges`) inside the shard [shard_start, shard_end)."""
    return [ShardPiece(param=params[index], name=names[index],
                       param_start=low - ranges[index][0], param_end=high - ranges[index][0],
                       shard_start=low - shard_start, shard_end=high - shard_start)
            for index, low, high in overlaps_with_shard(ranges, shard_start, shard_end)]


def pieces_in_shard(buffer: Any, bucket: Any, rank: int, world_size: int,
                    param_names: dict[Parameter, str]) -> list[ShardPiece]:
    """Intersect every parameter of `bucket` with rank `rank`'s shard (module docstring)."""
    ranges = [(buffer.param_index_map[param][0] - bucket.offset,  # bucket-relative
               buffer.param_index_map[param][1] - bucket.offset) for param in bucket.params]
    return pieces_in_range(bucket.params, [param_names[param] for param in bucket.params],
                           ranges, *shard_range(bucket, rank, world_size))
