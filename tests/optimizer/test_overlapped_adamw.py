"""OverlappedAdamW's CUDA path, run on CPU with stand-in streams and events.

On CUDA the host runs ahead of the GPU, so asking a reduction `is_completed()` from the host
says no for nearly every bucket: polling would leave every step to finish_grad_sync. Here the
reductions answer "not yet" the same way, and fake streams/events (as in
tests/parallel/test_powerSGD_streams_emulated.py) record the order of the queued work: each
bucket's step must be queued during backward, on the side stream, after that stream waited for
the bucket's reduction, and the compute stream must wait for each step before the gradients
are read. The parameters must equal those of the plain CPU path bit for bit. What cannot be
emulated: real concurrency of the streams (`make gpu-check` measures the overlap).
"""

from __future__ import annotations

import contextlib
import copy

import torch

from optimizer.overlapped_adamw import OverlappedAdamW
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.distributed_data_parallel.ddp_comm_hooks.default_hooks import allreduce_hook
from parallel.local_ranks import run_on_ranks
from parallel.side_stream import SideStream
from tests.parallel.toy_models import make_batch, make_mlp, mse_loss

HYPER = dict(lr=3e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)


class FakeStream:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log, self.device = name, log, torch.device("cpu")

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(f"{self.name} waits for {other.name}")

    def wait_event(self, event: FakeEvent) -> None:
        self.log.append(f"{self.name} waits for {event.name}")


class FakeEvent:
    def __init__(self) -> None:
        self.name = "?"

    def record(self, stream: FakeStream) -> None:
        self.name = f"event after {stream.log[-1]}"


def _install_fake_cuda_streams(log: list[str]) -> list[FakeStream]:
    default, side = FakeStream("default", log), FakeStream("side", log)
    current = [default]

    @contextlib.contextmanager
    def use_stream(stream):
        previous, current[0] = current[0], stream
        try:
            yield
        finally:
            current[0] = previous

    torch.cuda.current_stream = lambda device=None: current[0]
    torch.cuda.stream = use_stream
    torch.cuda.Event = FakeEvent


    def on(self, device):  # what the real one does, with the fake stream
        self.stream = side
        return side
    SideStream.on = on
    return current


def _train(ddp, optimizer, steps, log=None):
    for step in range(steps):
        inputs, targets = make_batch(0, step, 0)
        mse_loss(ddp, inputs, targets).backward()
        if log is not None:
            log.append("backward returned")
        ddp.finish_grad_sync()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in ddp.module.parameters()]


def _queued_on_the_side_stream(rank: int, world_size: int) -> tuple[list[str], int]:
    model = make_mlp(seed=0)
    config = DistributedDataParallelConfig(bucket_size=50, overlap_grad_reduce=True)
    plain = DistributedDataParallel(copy.deepcopy(model), config)
    expected = _train(plain, OverlappedAdamW(plain, **HYPER), steps=2)

    log: list[str] = []
    current = _install_fake_cuda_streams(log)

    def reduce_seen_from_a_host_ahead_of_the_gpu(group, bucket):
        handle = allreduce_hook(group, bucket)
        handle.is_completed = lambda: False
        inner_wait = handle.wait
        index = bucket.global_index

        def wait():
            log.append(f"{current[0].name} waits for reduction {index}")
            inner_wait()
        handle.wait = wait
        return handle

    ddp = DistributedDataParallel(copy.deepcopy(model), config)
    optimizer = OverlappedAdamW(ddp, reduce_hook=reduce_seen_from_a_host_ahead_of_the_gpu,
                                **HYPER)
    step_bucket = optimizer.step_bucket
    optimizer.step_bucket = lambda bucket: (
        log.append(f"step {bucket.global_index} on {current[0].name}"), step_bucket(bucket))
    got = _train(ddp, optimizer, steps=2, log=log)
    for mine, theirs in zip(got, expected, strict=True):
        assert torch.equal(mine, theirs)
    return log, len(optimizer.buckets)


def test_cuda_bucket_steps_are_queued_behind_their_reductions_during_backward():
    log, num_buckets = run_on_ranks(_queued_on_the_side_stream, world_size=1)[0]
    first_step = log[:log.index("backward returned", log.index("backward returned") + 1)]
    backward_returned = first_step.index("backward returned")
    steps = {i: first_step.index(f"step {i} on side") for i in range(num_buckets)}
    assert num_buckets >= 3
    assert sum(position < backward_returned for position in steps.values()) >= 2, first_step
    for i, position in steps.items():
        assert first_step.index(f"side waits for reduction {i}") == position - 1
        assert first_step.index(f"default waits for event after step {i} on side") > position
    assert "default waits for side" in first_step  # before step() reads the gradients
