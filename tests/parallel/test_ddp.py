"""Our DDP against torch.nn.parallel.DistributedDataParallel, on 2 gloo ranks."""

from __future__ import annotations

import copy
import time

import pytest
import torch
from torch import nn

from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.distributed_data_parallel.ddp_comm_hooks.default_hooks import allreduce_hook
from parallel.local_ranks import run_on_ranks
from tests.parallel.toy_models import make_batch, make_mlp, mse_loss

# (bucket_size, overlap_grad_reduce, accumulation steps): one bucket, several buckets, buckets
# smaller than any parameter; overlap on and off; with and without no_sync accumulation.
CONFIGS = [(None, True, 1), (100, True, 3), (1, True, 2), (100, False, 2), (None, False, 1)]


def _matches_torch_ddp(rank: int, world_size: int) -> int:
    compared = 0
    for bucket_size, overlap, accumulation_steps in CONFIGS:
        # Different initial weights per rank: both DDPs must broadcast rank 0's.
        model = make_mlp(seed=rank)
        ours = DistributedDataParallel(
            copy.deepcopy(model),
            DistributedDataParallelConfig(bucket_size=bucket_size, overlap_grad_reduce=overlap))
        theirs = nn.parallel.DistributedDataParallel(copy.deepcopy(model))
        our_params = list(ours.module.parameters())
        our_optimizer = torch.optim.AdamW(our_params, lr=1e-2)
        their_optimizer = torch.optim.AdamW(theirs.parameters(), lr=1e-2)
        for step in range(3):
            for micro_batch in range(accumulation_steps):
                inputs, targets = make_batch(rank, step, micro_batch)
                is_last = micro_batch == accumulation_steps - 1
                with ours.no_sync() if not is_last else torch.enable_grad():
                    mse_loss(ours, inputs, targets).backward()
                with theirs.no_sync() if not is_last else torch.enable_grad():
                    mse_loss(theirs, inputs, targets).backward()
            ours.finish_grad_sync()
            for (name, mine), theirs_param in zip(ours.module.named_parameters(),
                                                  theirs.module.parameters()):
                assert mine.grad is None, "our hook frees param.grad"
                torch.testing.assert_close(mine.main_grad, theirs_param.grad, rtol=1e-6,
                                           atol=1e-7, msg=f"{name} step {step}")
                compared += 1
            for param in our_params:
                param.grad = param.main_grad  # plain torch AdamW reads .grad
            our_optimizer.step()
            their_optimizer.step()
            for param in our_params:
                param.grad = None
            ours.zero_grad_buffer()
            their_optimizer.zero_grad()
        assert ours.comm_bytes_last_step > 0
    return compared


def test_gradients_match_torch_ddp() -> None:
    compared = run_on_ranks(_matches_torch_ddp)
    assert compared[0] == compared[1] == len(CONFIGS) * 3 * len(list(make_mlp(0).parameters()))


def _launch_order(rank: int, world_size: int, overlap: bool) -> list[str]:
    model = make_mlp(seed=0)
    ddp = DistributedDataParallel(
        model, DistributedDataParallelConfig(bucket_size=1, overlap_grad_reduce=overlap))
    events: list[str] = []

    def recording_hook(state, bucket):
        events.append(f"launch bucket {bucket.global_index}")
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, recording_hook)
    # The first layer's weight gets its gradient last in backward; this hook runs after ours.
    model[0].weight.register_post_accumulate_grad_hook(lambda _: events.append("first layer"))
    inputs, targets = make_batch(rank, 0, 0)
    mse_loss(ddp, inputs, targets).backward()
    events.append("backward done")
    ddp.finish_grad_sync()
    return events


def _launch_orders(rank: int, world_size: int) -> dict[bool, list[str]]:
    return {overlap: _launch_order(rank, world_size, overlap) for overlap in (True, False)}


def test_overlap_launches_first_bucket_during_backward() -> None:
    events = run_on_ranks(_launch_orders)[0]
    assert events[True].index("launch bucket 0") < events[True].index("first layer")
    launches = [event for event in events[True] if event.startswith("launch")]
    assert launches == [f"launch bucket {i}" for i in range(len(launches))], "in order"
    assert events[False].index("launch bucket 0") > events[False].index("backward done")


class _WithUnusedLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = make_mlp(seed=0)
        self.unused = nn.Linear(4, 4)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.mlp(inputs)


def _unused_parameters(rank: int, world_size: int) -> str:
    inputs, targets = make_batch(rank, 0, 0)
    strict = DistributedDataParallel(_WithUnusedLayer(), DistributedDataParallelConfig())
    mse_loss(strict, inputs, targets).backward()
    try:
        strict.finish_grad_sync()
    except RuntimeError as error:
        message = str(error)
    else:
        raise AssertionError("an unused parameter must be reported")
    allowing = DistributedDataParallel(
        _WithUnusedLayer(), DistributedDataParallelConfig(allow_unused_params=True, bucket_size=50))
    reference = nn.parallel.DistributedDataParallel(_WithUnusedLayer(), find_unused_parameters=True)
    mse_loss(allowing, inputs, targets).backward()
    mse_loss(reference, inputs, targets).backward()
    allowing.finish_grad_sync()
    for mine, theirs in zip(allowing.module.parameters(), reference.module.parameters()):
        expected = theirs.grad if theirs.grad is not None else torch.zeros_like(mine)
        torch.testing.assert_close(mine.main_grad, expected, rtol=1e-6, atol=1e-7)
    return message


def test_unused_parameter_is_named_or_allowed() -> None:
    message = run_on_ranks(_unused_parameters)[0]
    assert "unused.weight" in message and "unused.bias" in message
    assert "allow_unused_params" in message and "mlp.0.weight" not in message


def _one_rank_fails(rank: int, world_size: int, overlap: bool, failure: str) -> str:
    ddp = DistributedDataParallel(make_mlp(seed=0),
                                  DistributedDataParallelConfig(overlap_grad_reduce=overlap))
    if rank == 1:
        if failure == "hang":  # stuck past the collective timeout, then gone
            time.sleep(5.0)
        return failure  # leaves without joining the gradient reduction (its group is torn down)
    started = time.monotonic()
    try:
        inputs, targets = make_batch(rank, 0, 0)
        mse_loss(ddp, inputs, targets).backward()
        ddp.finish_grad_sync()
    except RuntimeError as error:
        return f"{time.monotonic() - started:.1f}s: {error}"
    raise AssertionError("the surviving rank must fail, not succeed")


@pytest.mark.parametrize(("overlap", "failure"), [(True, "quit"), (False, "hang")])
def test_a_failing_rank_makes_the_other_fail_clearly(overlap: bool, failure: str) -> None:
    message = run_on_ranks(_one_rank_fails, overlap, failure, collective_timeout_s=3.0,
                           timeout=60)[0]
    assert "reducing gradient bucket 0" in message and "another rank probably crashed" in message


def _second_backward_without_no_sync(rank: int, world_size: int) -> str:
    ddp = DistributedDataParallel(make_mlp(seed=0), DistributedDataParallelConfig(bucket_size=1))
    inputs, targets = make_batch(rank, 0, 0)
    mse_loss(ddp, inputs, targets).backward()  # launches every bucket (overlap)
    try:
        mse_loss(ddp, inputs, targets).backward()
    except RuntimeError as error:
        return str(error)
    raise AssertionError("a gradient added after its bucket's reduction began must be refused")


def test_second_backward_after_buckets_launched_is_refused() -> None:
    message = run_on_ranks(_second_backward_without_no_sync, world_size=1)[0]
    assert "arrived after its bucket's reduction started" in message and "no_sync()" in message
