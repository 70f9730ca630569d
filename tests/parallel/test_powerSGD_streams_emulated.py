"""PowerSGD's CUDA side-stream path run on CPU with stand-in stream objects.

On CUDA the hook compresses on a side stream: the side stream must first wait for the
gradients (the current stream), every compression op must run on the side stream, and the
current stream must wait for the side stream before anyone reads the result. Here fake streams
record those waits and a TorchFunctionMode records which stream each matmul ran on; the
gradients must equal the plain CPU path's bit for bit. What cannot be emulated: real
concurrency between streams and the caching allocator's cross-stream reuse (`make gpu-check`).
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch.overrides import TorchFunctionMode

from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.distributed_data_parallel.ddp_comm_hooks import powerSGD_hook as powersgd
from parallel.local_ranks import run_on_ranks
from parallel.side_stream import SideStream
from tests.parallel.toy_models import make_batch, make_mlp, mse_loss


class FakeStream:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(f"{self.name} waits for {other.name}")


class RecordMatmuls(TorchFunctionMode):
    def __init__(self, log: list[str], current: list[FakeStream]) -> None:
        super().__init__()
        self.log, self.current = log, current

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.matmul:
            self.log.append(f"matmul on {self.current[0].name}")
        return func(*args, **(kwargs or {}))


def _main_grads(model, log=None, steps=2, state=None):
    ddp = DistributedDataParallel(copy.deepcopy(model), DistributedDataParallelConfig())
    state = state or powersgd.PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=0,
                                            min_compression_rate=0.0)
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    grads = []
    for step in range(steps):
        inputs, targets = make_batch(0, step, 0)
        mse_loss(ddp, inputs, targets).backward()
        ddp.finish_grad_sync()
        if log is not None:
            log.append("grads read")
        grads.append([p.main_grad.clone() for p in ddp.module.parameters()])
        ddp.zero_grad_buffer()
    return grads


def _use_fake_streams(log: list[str]) -> list[FakeStream]:
    """Route torch.cuda's stream API and PowerSGD's side stream to fake streams; returns the
    one-element list holding the current stream."""
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
    SideStream.on = lambda self, device: side
    return current


def _on_fake_streams(rank: int, world_size: int) -> list[str]:
    model = make_mlp(seed=0)
    expected = _main_grads(model)
    log: list[str] = []
    current = _use_fake_streams(log)
    with RecordMatmuls(log, current):
        got = _main_grads(model, log)
    for got_step, expected_step in zip(got, expected, strict=True):
        for mine, theirs in zip(got_step, expected_step, strict=True):
            assert torch.equal(mine, theirs)
    return log


def test_side_stream_waits_and_ops_are_ordered():
    log = run_on_ranks(_on_fake_streams, world_size=1)[0]
    first_step = log[:log.index("grads read") + 1]
    matmuls = [i for i, event in enumerate(first_step) if event.startswith("matmul")]
    assert matmuls and all(first_step[i] == "matmul on side" for i in matmuls)
    assert first_step.index("side waits for default") < matmuls[0]
    release = first_step.index("default waits for side")
    assert matmuls[-1] < release < first_step.index("grads read")


def _resume_with_other_dtype_buffers(rank: int, world_size: int) -> tuple[list, list]:
    state = powersgd.PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=0,
                                   min_compression_rate=0.0)
    _main_grads(make_mlp(seed=0), state=state)
    saved = state.state_dict()
    resumed = powersgd.PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=0,
                                     min_compression_rate=0.0)
    resumed.load_state_dict({**saved, **{name: {key: value.double()
                                                for key, value in saved[name].items()}
                                         for name in ("error_dict", "q_memory_dict")}})
    old_buffers = {id(t): f"{name}[{key}]" for name in ("error_dict", "q_memory_dict")
                   for key, t in getattr(resumed, name).items()}
    log: list[str] = []
    _use_fake_streams(log)
    torch.Tensor.record_stream = lambda tensor, stream: log.append(
        f"{old_buffers.get(id(tensor), 'another tensor')} recorded on {stream.name}")
    _main_grads(make_mlp(seed=0), steps=1, state=resumed)
    return sorted(entry for entry in log if "recorded" in entry), sorted(old_buffers.values())


def test_resume_with_other_dtype_buffers_records_the_old_ones_on_the_side_stream():
    """After a resume with fp64 buffers for fp32 gradients, `.to(grad)` on the side stream
    reads buffers the compute stream's allocator may reuse: each is record_stream'ed."""
    recorded, old_buffers = run_on_ranks(_resume_with_other_dtype_buffers, world_size=1)[0]
    assert len(old_buffers) >= 2
    assert recorded == [f"{name} recorded on side" for name in old_buffers]
