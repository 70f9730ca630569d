"""The ZeRO-1 shard map against element-by-element ownership (no process group needed)."""

from __future__ import annotations

import random

import pytest
import torch

from optimizer.distributed_optimizer.shard_map import pieces_in_shard
from parallel.distributed_data_parallel.param_and_grad_buffer import ParamAndGradBuffer


def ownership_by_element(buffer, names, world_size: int) -> set[tuple]:
    """Reference: walk every element of every bucket, note (rank, param, index in param), and
    merge consecutive indices into (rank, name, param_start, param_end) ranges."""
    owned: dict[tuple[int, str], list[int]] = {}
    for bucket in buffer.buckets:
        shard_size = bucket.grad_data.numel() // world_size
        for param in bucket.params:
            start, end, _ = buffer.param_index_map[param]
            for element in range(start, end):
                rank = (element - bucket.offset) // shard_size
                owned.setdefault((rank, names[param]), []).append(element - start)
    ranges = set()
    for (rank, name), indices in owned.items():
        run_start = indices[0]
        for previous, current in zip(indices, indices[1:] + [None]):
            if current != previous + 1:
                ranges.add((rank, name, run_start, previous + 1))
                run_start = current
    return ranges


def make_buffer(sizes: list[int], bucket_size: int | None, world_size: int):
    params = [torch.nn.Parameter(torch.randn(size)) for size in sizes]
    buffer = ParamAndGradBuffer(params, torch.float32, torch.float32, bucket_size, world_size,
                                use_distributed_optimizer=True)
    return buffer, {param: f"p{index}" for index, param in enumerate(params)}


def shard_map(buffer, names, world_size: int) -> set[tuple]:
    return {(rank, piece.name, piece.param_start, piece.param_end)
            for rank in range(world_size) for bucket in buffer.buckets
            for piece in pieces_in_shard(buffer, bucket, rank, world_size, names)}


def test_worked_example_from_the_docstring():
    # Registered c, b, a: DDP places them in reverse, so the bucket reads a a a a a a b b b b c...
    buffer, names = make_buffer([5, 4, 6], bucket_size=None, world_size=4)
    assert buffer.numel == 16
    c, b, a = "p0", "p1", "p2"
    expected = {(0, a, 0, 4), (1, a, 4, 6), (1, b, 0, 2), (2, b, 2, 4), (2, c, 0, 2),
                (3, c, 2, 5)}
    assert shard_map(buffer, names, 4) == expected == ownership_by_element(buffer, names, 4)


@pytest.mark.parametrize("seed", range(8))
def test_random_layouts_match_element_by_element_ownership(seed):
    rng = random.Random(seed)
    world_size = rng.choice([1, 2, 3, 4, 8])
    sizes = [rng.randint(1, 40) for _ in range(rng.randint(1, 9))]
    bucket_size = rng.choice([None, 1, 7, 30, 100])
    buffer, names = make_buffer(sizes, bucket_size, world_size)
    assert shard_map(buffer, names, world_size) == ownership_by_element(buffer, names, world_size)
    # Shard offsets are consistent with the ranges: pieces of one shard never overlap.
    for bucket in buffer.buckets:
        for rank in range(world_size):
            pieces = pieces_in_shard(buffer, bucket, rank, world_size, names)
            spans = sorted((p.shard_start, p.shard_end) for p in pieces)
            assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))
            assert all(p.shard_end - p.shard_start == p.numel for p in pieces)
