"""Overlapped optimizer step == "reduce everything, then torch AdamW"; refusals; checkpoints."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from optimizer.overlapped_adamw import (
    OverlappedAdamW,
)
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.distributed_data_parallel.ddp_comm_hooks.default_hooks import allreduce_hook
from parallel.local_ranks import run_on_ranks
from tests.parallel.toy_models import make_batch, make_mlp, mse_loss

HYPER = dict(lr=3e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)


def _train_step(ddp: DistributedDataParallel, rank: int, step: int) -> None:
    for micro_batch in range(2):  # with gradient accumulation
        inputs, targets = make_batch(rank, step, micro_batch)
        with ddp.no_sync() if micro_batch == 0 else torch.enable_grad():
            mse_loss(ddp, inputs, targets).backward()
    ddp.finish_grad_sync()


def _overlapped_vs_plain(rank: int, world_size: int, checkpoint_dir: str) -> list[str]:
    model = make_mlp(seed=rank)
    config = DistributedDataParallelConfig(bucket_size=50)  # 3 buckets
    overlapped = DistributedDataParallel(copy.deepcopy(model), config)
    optimizer = OverlappedAdamW(overlapped, **HYPER)
    plain = DistributedDataParallel(copy.deepcopy(model), config)
    params = list(plain.module.parameters())
    reference = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": HYPER["weight_decay"]},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=HYPER["lr"], betas=HYPER["betas"], eps=HYPER["eps"])

    events: list[str] = []
    step_bucket = optimizer.step_bucket
    optimizer.step_bucket = lambda bucket: (events.append(f"step {bucket.global_index}"),
                                            step_bucket(bucket))
    optimizer.reduce_hook = lambda group, bucket: _recording_reduce(events, group, bucket)

    for step in range(4):
        optimizer.set_lr(HYPER["lr"] / (step + 1))
        for group in reference.param_groups:
            group["lr"] = HYPER["lr"] / (step + 1)
        _train_step(overlapped, rank, step)
        stepped, grad_norm = optimizer.step()
        _train_step(plain, rank, step)
        expected_norm = torch.cat([p.main_grad.flatten() for p in params]).norm().item()
        for param in params:
            param.grad = param.main_grad
        reference.step()
        for param in params:
            param.grad = None
        assert stepped and grad_norm == pytest.approx(expected_norm, rel=1e-6)
        for (name, mine), theirs in zip(overlapped.module.named_parameters(), params):
            torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7, msg=name)
        optimizer.zero_grad()
        plain.zero_grad_buffer()
        if step == 1:
            optimizer.save_checkpoint(checkpoint_dir)
            dist.barrier()
            resumed_model = copy.deepcopy(overlapped.module)
    assert optimizer.get_lr() == pytest.approx(HYPER["lr"] / 4)

    # Resume from the step-2 checkpoint: the next two steps must be bitwise identical.
    resumed = DistributedDataParallel(resumed_model, config)
    resumed_optimizer = OverlappedAdamW(resumed, **HYPER)
    resumed_optimizer.load_checkpoint(checkpoint_dir)
    for step in (2, 3):
        resumed_optimizer.set_lr(HYPER["lr"] / (step + 1))
        _train_step(resumed, rank, step)
        resumed_optimizer.step()
        resumed_optimizer.zero_grad()
    for mine, theirs in zip(resumed.module.parameters(), overlapped.module.parameters()):
        assert torch.equal(mine, theirs)
    return events


def _recording_reduce(events: list[str], group, bucket):
    handle = allreduce_hook(group, bucket)
    wait = handle.wait
    handle.wait = lambda: (wait(), events.append(f"reduced {bucket.global_index}"))
    return handle


def test_overlapped_step_equals_reduce_then_adamw(tmp_path: Path) -> None:
    events = run_on_ranks(_overlapped_vs_plain, str(tmp_path))[0]
    first_step_end = events.index("step 0", events.index("step 0") + 1)
    one_step = events[:first_step_end]
    num_buckets = sum(event.startswith("step") for event in one_step)
    assert num_buckets >= 3
    # Bucket 0 is updated before the last bucket's reduction has been waited for.
    assert one_step.index("step 0") < one_step.index(f"reduced {num_buckets - 1}")
    assert one_step.index("reduced 0") < one_step.index("step 0")


def _refusals(rank: int, world_size: int) -> list[str]:
    messages = []
    ddp = DistributedDataParallel(make_mlp(seed=0), DistributedDataParallelConfig())
    for options in (dict(clip_grad=1.0), dict(params_dtype="fp16")):
        try:
            OverlappedAdamW(ddp, lr=1e-3, **options)
        except ValueError as error:
            messages.append(str(error))
    return messages


def test_refuses_clipping_and_fp16_with_the_reason() -> None:
    clip_message, fp16_message = run_on_ranks(_refusals)[0]
    assert "clip" in clip_message and "global norm" in clip_message
    assert "fp16" in fp16_message and "overflow" in fp16_message


def _bf16_params_use_fp32_masters(rank: int, world_size: int) -> None:
    for grad_reduce_in_fp32 in (True, False):
        _bf16_params_with_grads_reduced_in(rank, grad_reduce_in_fp32)


def _bf16_params_with_grads_reduced_in(rank: int, grad_reduce_in_fp32: bool) -> None:
    model = make_mlp(seed=rank).to(torch.bfloat16)
    config = DistributedDataParallelConfig(bucket_size=50, grad_reduce_in_fp32=grad_reduce_in_fp32)
    overlapped = DistributedDataParallel(copy.deepcopy(model), config)
    optimizer = OverlappedAdamW(overlapped, params_dtype="bf16", **HYPER)
    plain = DistributedDataParallel(copy.deepcopy(model), config)
    params = list(plain.module.parameters())
    masters = [p.detach().float() for p in params]  # reference: fp32 master weights by hand
    reference = torch.optim.AdamW(
        [{"params": [m for m in masters if m.dim() >= 2], "weight_decay": HYPER["weight_decay"]},
         {"params": [m for m in masters if m.dim() < 2], "weight_decay": 0.0}],
        lr=HYPER["lr"], betas=HYPER["betas"], eps=HYPER["eps"])
    for step in range(3):
        for ddp in (overlapped, plain):
            inputs, targets = make_batch(rank, step, 0)
            mse_loss(ddp, inputs.bfloat16(), targets.bfloat16()).backward()
            ddp.finish_grad_sync()
        optimizer.step()
        for master, param in zip(masters, params):
            expected_dtype = torch.float32 if grad_reduce_in_fp32 else torch.bfloat16
            assert param.main_grad.dtype == expected_dtype
            master.grad = param.main_grad.float()
        reference.step()
        with torch.no_grad():
            for master, param in zip(masters, params):
                param.copy_(master)
        for mine, theirs in zip(overlapped.module.parameters(), params):
            assert mine.dtype == torch.bfloat16 and torch.equal(mine, theirs)
        optimizer.zero_grad()
        plain.zero_grad_buffer()


def test_bf16_params_step_on_fp32_masters() -> None:
    run_on_ranks(_bf16_params_use_fp32_masters)


def _reduce_and_wait(group, bucket):
    """A reduce hook that has finished when it returns: makes "reduced by the next launch"
    certain, so the order of events below does not depend on gloo's thread timing."""
    handle = allreduce_hook(group, bucket)
    for work in handle.works:
        work.wait()
    return handle


def _steps_during_backward(rank: int, world_size: int) -> tuple[list[str], list[str]]:
    model = make_mlp(seed=rank)
    overlapping = DistributedDataParallel(copy.deepcopy(model), DistributedDataParallelConfig(
        bucket_size=50, overlap_grad_reduce=True))
    optimizer = OverlappedAdamW(overlapping, reduce_hook=_reduce_and_wait, **HYPER)
    after_backward = DistributedDataParallel(copy.deepcopy(model), DistributedDataParallelConfig(
        bucket_size=50, overlap_grad_reduce=False))
    reference = OverlappedAdamW(after_backward, **HYPER)  # every bucket steps after backward

    events: list[str] = []
    for name, param in overlapping.module.named_parameters():  # runs after DDP's own hook
        param.register_post_accumulate_grad_hook(lambda _, name=name: events.append(f"grad {name}"))
    step_bucket = optimizer.step_bucket
    optimizer.step_bucket = lambda bucket: (events.append(f"step {bucket.global_index}"),
                                            step_bucket(bucket))
    for step in range(3):
        events.append(f"begin {step}")
        for ddp, adamw in ((overlapping, optimizer), (after_backward, reference)):
            inputs, targets = make_batch(rank, step, 0)
            mse_loss(ddp, inputs, targets).backward()
            ddp.finish_grad_sync()
            adamw.step()
            adamw.zero_grad()
        for mine, theirs in zip(overlapping.module.parameters(),
                                after_backward.module.parameters(), strict=True):
            assert torch.equal(mine, theirs)  # bitwise: per-bucket AdamW, order-independent
    return events, [str(len(optimizer.buckets))]


def test_buckets_step_while_backward_still_produces_gradients() -> None:
    events, (num_buckets,) = run_on_ranks(_steps_during_backward)[0]
    first_step = events[:events.index("begin 1")]
    last_grad = max(i for i, event in enumerate(first_step) if event.startswith("grad"))
    stepped_early = [e for e in first_step[:last_grad] if e.startswith("step")]
    assert int(num_buckets) >= 3 and len(stepped_early) >= 2, first_step
    assert sorted(e for e in first_step if e.startswith("step")) == [
        f"step {i}" for i in range(int(num_buckets))]
