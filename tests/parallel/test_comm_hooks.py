"""Default comm hooks: reduce-scatter (ZeRO-1) shards and bf16/fp16 compression vs exact."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.distributed_data_parallel.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    bf16_compress_wrapper,
    fp16_compress_wrapper,
    reduce_scatter_hook,
)
from parallel.local_ranks import run_on_ranks
from tests.parallel.toy_models import make_batch, make_mlp, mse_loss


def _flat_reference(ddp: DistributedDataParallel, rank: int, world_size: int,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact average (torch DDP) and |g_0| + |g_1| (all local gradients), in our buffer layout."""
    module = ddp.module
    exact = nn.parallel.DistributedDataParallel(copy.deepcopy(module))
    local = copy.deepcopy(module)
    inputs, targets = make_batch(rank, 0, 0)
    mse_loss(exact, inputs, targets).backward()
    mse_loss(local, inputs, targets).backward()
    buffer = ddp.param_and_grad_buffers[0]
    exact_flat = torch.zeros_like(buffer.grad_data)
    abs_sum_flat = torch.zeros_like(buffer.grad_data)
    for name, param in module.named_parameters():
        start, end, _ = buffer.param_index_map[param]
        exact_flat[start:end] = exact.module.get_parameter(name).grad.flatten()
        abs_sum_flat[start:end] = local.get_parameter(name).grad.flatten().abs()
    dist.all_reduce(abs_sum_flat)
    return exact_flat, abs_sum_flat


def _reduce_with(rank: int, world_size: int, hook, use_distributed_optimizer: bool,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    ddp = DistributedDataParallel(
        make_mlp(seed=0), DistributedDataParallelConfig(
            bucket_size=100, use_distributed_optimizer=use_distributed_optimizer))
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    exact, abs_sum = _flat_reference(ddp, rank, world_size)
    inputs, targets = make_batch(rank, 0, 0)
    mse_loss(ddp, inputs, targets).backward()
    ddp.finish_grad_sync()
    if not use_distributed_optimizer:
        return ddp.param_and_grad_buffers[0].grad_data, exact, abs_sum, ddp.comm_bytes_last_step
    # Only this rank's shard of every bucket is reduced: compare those slices.
    shards = [bucket.offset + rank * bucket.grad_data.numel() // world_size
              for bucket in ddp.param_and_grad_buffers[0].buckets]
    mine = torch.cat([bucket.grad_data.view(world_size, -1)[rank]
                      for bucket in ddp.param_and_grad_buffers[0].buckets])
    indices = torch.cat([torch.arange(start, start + bucket.grad_data.numel() // world_size)
                         for start, bucket in zip(shards, ddp.param_and_grad_buffers[0].buckets)])
    for param in ddp.module.parameters():  # ZeRO-1 parameters live in param_data
        start, _, _ = ddp.param_and_grad_buffers[0].param_index_map[param]
        assert param.data_ptr() == ddp.param_and_grad_buffers[0].param_data[start:].data_ptr()
    return mine, exact[indices], abs_sum[indices], ddp.comm_bytes_last_step


def _all_hooks(rank: int, world_size: int) -> dict[str, tuple[float, float, int]]:
    """Per hook: max error, max allowed error, and bytes sent."""
    cases = {
        "allreduce": (allreduce_hook, False, 0.0),
        "bf16": (bf16_compress_wrapper(allreduce_hook), False, torch.finfo(torch.bfloat16).eps),
        "fp16": (fp16_compress_wrapper(allreduce_hook), False, torch.finfo(torch.float16).eps),
        "reduce_scatter": (None, True, 0.0),  # DDP's default with use_distributed_optimizer
        "bf16 reduce_scatter": (bf16_compress_wrapper(reduce_scatter_hook), True,
                                torch.finfo(torch.bfloat16).eps),
    }
    results = {}
    for name, (hook, use_distributed_optimizer, eps) in cases.items():
        mine, exact, abs_sum, bytes_sent = _reduce_with(rank, world_size, hook,
                                                        use_distributed_optimizer)
        # Two roundings (cast, then the sum), each at most eps/2 relative to what is rounded.
        allowed = eps * abs_sum + 1e-7
        assert ((mine - exact).abs() <= allowed).all(), name
        if eps > 0:
            assert not torch.equal(mine, exact), f"{name}: compression must change something"
        results[name] = ((mine - exact).abs().max().item(), allowed.max().item(), bytes_sent)
    return results


def test_compression_and_reduce_scatter_against_exact() -> None:
    results = run_on_ranks(_all_hooks)[0]
    full = results["allreduce"][2]
    assert results["allreduce"][0] < 1e-7
    assert results["bf16"][2] == results["fp16"][2] == full // 2
    assert results["reduce_scatter"][2] == full // 2  # ring: (W-1)/W vs 2 (W-1)/W
    assert results["bf16 reduce_scatter"][2] == full // 4
