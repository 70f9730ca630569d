"""Layout of the contiguous gradient buffer: the docstring's worked example and invariants."""

from __future__ import annotations

import random

import pytest
import torch
from torch.nn import Parameter

from parallel.distributed_data_parallel.param_and_grad_buffer import (
    ParamAndGradBuffer,
    pad_to_multiple,
)


def _params(numels: list[int], seed: int = 0) -> list[Parameter]:
    torch.manual_seed(seed)
    return [Parameter(torch.randn(n)) for n in numels]


def test_worked_example_from_docstring() -> None:
    a, b, c = _params([3, 4, 5])
    buffer = ParamAndGradBuffer([a, b, c], torch.float32, torch.float32, bucket_size=6,
                                data_parallel_world_size=2, use_distributed_optimizer=False)
    assert buffer.param_index_map == {c: (0, 5, 0), b: (5, 9, 0), a: (10, 13, 1)}
    assert [(bk.offset, bk.grad_data.numel()) for bk in buffer.buckets] == [(0, 10), (10, 4)]
    assert [bk.params for bk in buffer.buckets] == [[c, b], [a]]
    assert buffer.numel == 14


@pytest.mark.parametrize("use_distributed_optimizer", [False, True])
def test_invariants_on_random_layouts(use_distributed_optimizer: bool) -> None:
    rng = random.Random(1234)
    for trial in range(30):
        numels = [rng.randint(1, 40) for _ in range(rng.randint(1, 8))]
        world_size = rng.choice([1, 2, 3, 4, 8])
        bucket_size = rng.choice([None, 1, 7, 30, 1000])
        params = _params(numels, seed=trial)
        original_values = [p.detach().clone() for p in params]
        buffer = ParamAndGradBuffer(params, torch.float32, torch.float32, bucket_size,
                                    world_size, use_distributed_optimizer)

        # Everything splits evenly over the ranks.
        assert buffer.numel % world_size == 0
        assert all(bk.grad_data.numel() % world_size == 0 for bk in buffer.buckets)
        # Reverse order of registration: later parameters start earlier in the buffer.
        starts = [buffer.param_index_map[p][0] for p in params]
        assert starts == sorted(starts, reverse=True)
        # Bucket size: a bucket closes at the first parameter that makes it reach bucket_size.
        for bucket in buffer.buckets[:-1]:
            content = sum(p.numel() for p in bucket.params)
            assert bucket_size is not None and content >= bucket_size
            assert content - bucket.params[-1].numel() < bucket_size
        assert pad_to_multiple(sum(p.numel() for p in buffer.buckets[-1].params),
                               world_size) == buffer.buckets[-1].grad_data.numel()
        # main_grad (and, for ZeRO-1, the parameter itself) are views sharing the buffer.
        buffer.grad_data.copy_(torch.randn(buffer.numel))
        for param, value in zip(params, original_values):
            start, end, bucket_index = buffer.param_index_map[param]
            assert torch.equal(param.main_grad.flatten(), buffer.grad_data[start:end])
            bucket = buffer.buckets[bucket_index]
            # (list.index would compare tensor values, so look the parameter up by identity)
            position = [id(p) for p in bucket.params].index(id(param))
            view = bucket.grad_views()[position]
            assert view.data_ptr() == param.main_grad.data_ptr()
            assert torch.equal(param.detach(), value)  # values survive the move
            if use_distributed_optimizer:
                assert param.data_ptr() == buffer.param_data[start:].data_ptr()
        if not use_distributed_optimizer:
            assert buffer.param_data is None
        # Padding carries no parameter: the parameter ranges plus padding tile the buffer.
        covered = sum(end - start for start, end, _ in buffer.param_index_map.values())
        assert covered == sum(numels)


def test_rejects_bad_bucket_size() -> None:
    with pytest.raises(ValueError, match="bucket_size"):
        ParamAndGradBuffer(_params([3]), torch.float32, torch.float32, 0, 2, False)
