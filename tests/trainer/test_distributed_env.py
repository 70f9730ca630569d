"""`all_reduce_sum_lists` (trainer/distributed_env.py) on 2 gloo ranks equals the per-list sums
computed in one process: several lists, one collective, cut back to their lengths."""

from __future__ import annotations

import torch

from parallel.local_ranks import run_on_ranks
from trainer.distributed_env import DistributedEnv, all_reduce_sum_lists, init_distributed


def _lists_of(rank: int) -> list[list[float]]:
    return [[1.0 + rank, 0.5], [], [float(10 * rank)], [rank * 2.0**40, 3.0, -rank]]


def _sums_on_rank(rank: int, world_size: int) -> list[list[float]]:
    return all_reduce_sum_lists(_lists_of(rank), init_distributed("cpu", num_threads=1))


def test_all_reduce_sum_lists_sums_each_list_over_the_ranks():
    expected = [[sum(values) for values in zip(*lists)]
                for lists in zip(_lists_of(0), _lists_of(1))]
    assert expected[1] == []  # an empty list comes back empty, in its place
    for per_rank in run_on_ranks(_sums_on_rank, world_size=2):
        assert per_rank == expected


def test_a_world_of_one_returns_its_own_lists():
    env = DistributedEnv(rank=0, world_size=1, local_rank=0, local_world_size=1,
                         device=torch.device("cpu"))
    assert all_reduce_sum_lists(_lists_of(0), env) == _lists_of(0)
