"""`make gpu-check`: the real CUDA paths against their CPU references. Skipped without a GPU.

These run what the CPU-only test suite can only emulate (tests/fake_gpu_libs): the model's
kernels in bf16 on the GPU (flash-attn/apex when installed), NCCL collectives, PowerSGD's side
stream, ZeRO-1 with its state offloaded to pinned CPU memory. Each compares with the same
computation on the CPU (fp32, gloo). A world of one process suffices: the NCCL group is made
beside the gloo default group, so one process runs both sides.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from model import kernels
from optimizer import OptimizerConfig, get_optimizer
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.distributed_data_parallel.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    powerSGD_hook,
)
from parallel.local_ranks import run_on_ranks
from tests.model.model_helpers import random_batch, small_model
from tests.parallel.toy_models import make_batch, make_mlp, mse_loss

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    got, expected = got.detach().float().cpu(), expected.detach().float().cpu()
    return float((got - expected).abs().max() / expected.abs().max().clamp(min=1e-12))


@pytest.mark.parametrize("padded", [False, True])
def test_model_bf16_on_cuda_matches_fp32_on_cpu(padded):
    reference = small_model("gqa", hidden_size=128, num_attention_heads=4)  # head_dim 32
    model = copy.deepcopy(reference).to("cuda", torch.bfloat16)
    input_ids, labels = random_batch(3, 40)
    mask = torch.ones_like(input_ids)
    if padded:  # right padding, as the SFT/DPO collators make: flash-attn's varlen path
        mask[0, 25:] = 0
        labels = labels.masked_fill(mask == 0, -100)
    print(kernels.kernel_choices(torch.device("cuda"), torch.bfloat16, 32))
    losses = []
    for net, device in ((reference, "cpu"), (model, "cuda")):
        loss = net(input_ids.to(device), labels=labels.to(device),
                   attention_mask=mask.to(device)).loss
        loss.backward()
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=2e-2)
    for (name, expected), got in zip(reference.named_parameters(), model.parameters()):
        assert _relative_error(got.grad, expected.grad) < 5e-2, name


def _ddp_grads(model, process_group, device, steps=2, bucket_size=60, state=None):
    """main_grad of every parameter after each of `steps` steps; with `state`, PowerSGD."""
    ddp = DistributedDataParallel(copy.deepcopy(model).to(device),
                                  DistributedDataParallelConfig(bucket_size=bucket_size,
                                                                overlap_grad_reduce=True),
                                  process_group=process_group)
    if state is not None:
        ddp.register_comm_hook(state, powerSGD_hook)
    grads = []
    for step in range(steps):
        inputs, targets = make_batch(0, step, 0)
        mse_loss(ddp, inputs.to(device), targets.to(device)).backward()
        ddp.finish_grad_sync()
        grads.append([p.main_grad.cpu().clone() for p in ddp.module.parameters()])
        ddp.zero_grad_buffer()
    return grads


def _nccl_vs_gloo(rank: int, world_size: int) -> None:
    nccl = dist.new_group(backend="nccl")
    model = make_mlp(seed=0)
    for on_gpu, on_cpu in zip(_ddp_grads(model, nccl, "cuda"), _ddp_grads(model, None, "cpu")):
        for got, expected in zip(on_gpu, on_cpu):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_nccl_ddp_matches_gloo():
    run_on_ranks(_nccl_vs_gloo, world_size=1)


def _powersgd_grads(model, process_group, device, steps=3):
    state = PowerSGDState(process_group, matrix_approximation_rank=2, start_powerSGD_iter=1,
                          min_compression_rate=0.0)
    return _ddp_grads(model, process_group, device, steps, bucket_size=None, state=state), state


def _powersgd_side_stream_vs_cpu(rank: int, world_size: int) -> None:
    nccl = dist.new_group(backend="nccl")
    model = make_mlp(seed=0)
    gpu_grads, gpu_state = _powersgd_grads(model, nccl, "cuda")
    cpu_grads, _ = _powersgd_grads(model, None, "cpu")
    assert gpu_state._stream is not None  # the compression really ran on a side stream
    for on_gpu, on_cpu in zip(gpu_grads, cpu_grads):
        for got, expected in zip(on_gpu, on_cpu):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_powersgd_on_a_side_stream_matches_the_cpu_hook():
    run_on_ranks(_powersgd_side_stream_vs_cpu, world_size=1)


def _zero1_params(model, process_group, device, cpu_offload, steps=3):
    ddp = DistributedDataParallel(copy.deepcopy(model).to(device), DistributedDataParallelConfig(
        bucket_size=60, use_distributed_optimizer=True), process_group=process_group)
    optimizer = get_optimizer(OptimizerConfig(lr=1e-2, weight_decay=0.1, clip_grad=1.0,
                                              use_distributed_optimizer=True,
                                              cpu_offload=cpu_offload), ddp)
    for step in range(steps):
        optimizer.zero_grad()
        inputs, targets = make_batch(0, step, 0)
        mse_loss(ddp, inputs.to(device), targets.to(device)).backward()
        ddp.finish_grad_sync()
        optimizer.step()
    optimizer.finish_param_sync()
    return [p.detach().cpu() for p in ddp.module.parameters()]


def _zero1_offload_vs_cpu(rank: int, world_size: int) -> None:
    nccl = dist.new_group(backend="nccl")
    model = make_mlp(seed=0)
    on_gpu = _zero1_params(model, nccl, "cuda", cpu_offload=True)
    on_cpu = _zero1_params(model, None, "cpu", cpu_offload=False)
    for got, expected in zip(on_gpu, on_cpu):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_zero1_with_cpu_offload_on_cuda_matches_cpu():
    run_on_ranks(_zero1_offload_vs_cpu, world_size=1)
