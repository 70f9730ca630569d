import pytest
import torch
import torch.distributed as dist

from parallel.local_ranks import run_on_ranks


def _all_reduce_random(rank, world_size, seed):
    generator = torch.Generator().manual_seed(seed + rank)
    local = torch.randn(5, generator=generator)
    total = local.clone()
    dist.all_reduce(total)
    return local, total


def _fail_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("boom on rank one")
    return rank


def test_results_come_back_in_rank_order_and_collectives_work():
    (local0, total0), (local1, total1) = run_on_ranks(_all_reduce_random, 7, world_size=2)
    torch.testing.assert_close(total0, local0 + local1)
    torch.testing.assert_close(total1, local0 + local1)


def test_exception_on_a_rank_is_reraised_with_its_traceback():
    with pytest.raises(RuntimeError, match="boom on rank one"):
        run_on_ranks(_fail_on_rank_one, world_size=2, timeout=60)
