"""ZeRO checkpoints across stages and world sizes: saved at stage 3 on 2 ranks, resumed at
stage 3 (bitwise), stage 2 and stage 1 on 2 ranks, and stages 2 and 1 on 1 rank.

Reference: the same stage-3 run without interruption. A resume restores the whole model
weights (saved whole: `full_state_dict()` gathers them) and the optimizer's shard files
(ZeRO-1's piece format, re-cut by name and element range for any stage and world size).
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from optimizer.data_parallel_factory import build_data_parallel
from parallel.distributed_data_parallel import DistributedDataParallelConfig
from parallel.local_ranks import run_on_ranks
from parallel_plan.llama_units import zero_units
from tests.parallel.zero_helpers import (
    as_numpy,
    batches,
    make_optimizer_config,
    max_diff,
    new_model,
    train_step,
)

SAVE_AFTER, TOTAL_STEPS = 2, 3
DDP_CONFIG = DistributedDataParallelConfig(bucket_size=3000)


def whole_state(wrapped, optimizer) -> dict:
    if hasattr(wrapped, "full_state_dict"):
        return wrapped.full_state_dict()
    optimizer.finish_param_sync()
    return {n: t.detach().clone() for n, t in wrapped.module.state_dict().items()}


def train(zero_stage: int, rank: int, world_size: int, steps: range, checkpoint=None):
    model = new_model()
    if checkpoint is not None:
        model.load_state_dict(torch.load(checkpoint / "model.pt", weights_only=True))
    wrapped, optimizer, _ = build_data_parallel(model, zero_stage, DDP_CONFIG,
                                                make_optimizer_config(), is_unit=zero_units(model))
    if checkpoint is not None:
        optimizer.load_checkpoint(checkpoint / "optim")
    data = batches(TOTAL_STEPS, world_size=2)  # the same global batches at any world size
    for step in steps:
        train_step(wrapped, optimizer, data[step], rank, world_size)
    return wrapped, optimizer


def save_and_resume_on_two_ranks(rank: int, world_size: int, directory) -> dict:
    uninterrupted = train(3, rank, world_size, range(TOTAL_STEPS))
    results = {"uninterrupted": whole_state(*uninterrupted)}
    wrapped, optimizer = train(3, rank, world_size, range(SAVE_AFTER))
    (directory / "optim").mkdir(exist_ok=True)
    state = wrapped.full_state_dict()
    if rank == 0:
        torch.save(state, directory / "model.pt")
    optimizer.save_checkpoint(directory / "optim")
    dist.barrier()
    for stage in (3, 2, 1):
        resumed = train(stage, rank, world_size, range(SAVE_AFTER, TOTAL_STEPS), directory)
        results[stage] = whole_state(*resumed)
    return as_numpy(results)


def resume_on_one_rank(rank: int, world_size: int, directory) -> dict:
    return as_numpy({stage: whole_state(*train(stage, rank, world_size,
                                               range(SAVE_AFTER, TOTAL_STEPS), directory))
                     for stage in (2, 1)})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("zero3_checkpoint")
    two = run_on_ranks(save_and_resume_on_two_ranks, directory, world_size=2, timeout=300)
    one = run_on_ranks(resume_on_one_rank, directory, world_size=1, timeout=300)
    return two, one


@functools.cache
def initial_state() -> dict:
    return new_model().state_dict()


def test_same_stage_and_size_resumes_bitwise(runs):
    two, _ = runs
    for rank_result in two:
        assert max_diff(rank_result["uninterrupted"], initial_state()) > 1e-4
        assert max_diff(rank_result[3], rank_result["uninterrupted"]) == 0.0


@pytest.mark.parametrize("zero_stage", [2, 1])
def test_stage3_checkpoint_resumes_at_stage_2_and_1_on_two_ranks(runs, zero_stage):
    two, _ = runs
    for rank_result in two:
        assert max_diff(rank_result[zero_stage], rank_result["uninterrupted"]) < 1e-6


@pytest.mark.parametrize("zero_stage", [2, 1])
def test_stage3_checkpoint_resumes_on_one_rank(runs, zero_stage):
    two, one = runs
    assert max_diff(one[0][zero_stage], two[0]["uninterrupted"]) < 1e-6
