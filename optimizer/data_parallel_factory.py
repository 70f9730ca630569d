"""`build_data_parallel(...)`: the model wrapper and optimizer for ZeRO stage 0, 1, 2 or 3.

    stage  wrapper                                         optimizer
    0      DistributedDataParallel (all-reduce)            FP32Optimizer / Float16... / Overlapped
    1      DistributedDataParallel (reduce-scatter)        DistributedOptimizer (state sharded)
    2      ShardedDataParallel (grads sharded)             ShardedOptimizer
    3      ShardedDataParallel (grads and params sharded)  ShardedOptimizer

Every wrapper offers the loop the same calls (`no_sync()`, `finish_grad_sync()`, `module`,
`process_group`) and every optimizer the `TrainingOptimizer` protocol, so the training loop does
not branch on the stage. `--comm_hook` (the choices: `COMM_HOOKS` below) only
applies to our DDP: ZeRO-2/3 reduce-scatter unit by unit themselves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.distributed as dist

from optimizer.factory import TrainingOptimizer, get_optimizer
from optimizer.optimizer_config import OptimizerConfig
from optimizer.sharded_optimizer import ShardedOptimizer
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.distributed_data_parallel.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    bf16_compress_wrapper,
    reduce_scatter_hook,
)
from parallel.distributed_data_parallel.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    powerSGD_hook,
)
from parallel.sharded_data_parallel import ShardedDataParallel

ZERO_STAGES = (0, 1, 2, 3)
COMM_HOOKS = ("allreduce", "bf16", "powersgd", "overlap_optim")


def zero_stage_of(zero_stage: int, use_distributed_optimizer: bool) -> int:
    """The effective stage: `--use_distributed_optimizer` is the old spelling of stage 1."""
    return max(zero_stage, int(use_distributed_optimizer))


def check_zero_options(zero_stage: int, comm_hook: str = "allreduce",
                       use_distributed_optimizer: bool = False, cpu_offload: bool = False,
                       overlap_param_gather: bool = False) -> int:
    """The effective ZeRO stage (`--use_distributed_optimizer` is the old spelling of stage 1),
    or a one-line ValueError naming the options that cannot work together (the trainer's
    option check calls this before any work)."""
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"--zero_stage must be one of {ZERO_STAGES}, got {zero_stage}")
    if comm_hook not in COMM_HOOKS:
        raise ValueError(f"--comm_hook must be one of {COMM_HOOKS}, got {comm_hook!r}")
    if use_distributed_optimizer and zero_stage >= 2:
        raise ValueError(f"--use_distributed_optimizer means --zero_stage=1; drop it to "
                         f"use --zero_stage={zero_stage}")
    zero_stage = zero_stage_of(zero_stage, use_distributed_optimizer)
    if zero_stage >= 2:
        refused = [name for name, on in (
            (f"--comm_hook={comm_hook}", comm_hook != "allreduce"),
            ("--cpu_offload", cpu_offload),
            ("--overlap_param_gather", overlap_param_gather)) if on]
        if refused:
            raise ValueError(f"{', '.join(refused)} cannot be combined with "
                             f"--zero_stage={zero_stage} (they work on our DDP's buckets; "
                             f"ZeRO-2/3 reduce unit by unit): use --zero_stage 0 or 1")
    why_not_zero1 = {  # the hooks that reduce whole buckets, where ZeRO-1 reduce-scatters
        "powersgd": "its low-rank factors are all-reduced whole, so no rank's shard is ever "
                    "reduced alone; use --comm_hook=bf16 (a bf16 reduce-scatter, half the bytes) "
                    "or --zero_stage=0",
        "overlap_optim": "it steps whole buckets, ZeRO-1 steps each rank's shard; use "
                         "--comm_hook=allreduce or bf16, or --zero_stage=0"}
    if zero_stage == 1 and comm_hook in why_not_zero1:
        raise ValueError(f"--comm_hook={comm_hook} cannot be combined with --zero_stage=1 "
                         f"(--use_distributed_optimizer): {why_not_zero1[comm_hook]}")
    if zero_stage == 0 and (cpu_offload or overlap_param_gather):
        raise ValueError("--cpu_offload and --overlap_param_gather need --zero_stage=1")
    return zero_stage


def build_data_parallel(model: torch.nn.Module, zero_stage: int,
                        ddp_config: DistributedDataParallelConfig,
                        optimizer_config: OptimizerConfig,
                        process_group: dist.ProcessGroup | None = None,
                        comm_hook: str = "allreduce",
                        powersgd_state: PowerSGDState | None = None, *,
                        is_unit: Callable[[torch.nn.Module], bool],
                        ) -> tuple[torch.nn.Module, TrainingOptimizer, PowerSGDState | None]:
    """(the wrapped model, the optimizer the loop steps, the comm hook state a checkpoint must
    save or None). `process_group` is the data-parallel group (None = all ranks); `is_unit`
    the ZeRO-2/3 unit boundaries, the model's knowledge (for our llama its decoder blocks:
    parallel_plan/llama_units.py)."""
    zero_stage = check_zero_options(
        zero_stage, comm_hook, optimizer_config.use_distributed_optimizer,
        optimizer_config.cpu_offload, optimizer_config.overlap_param_gather)
    if zero_stage >= 2:
        wrapped = ShardedDataParallel(model, zero_stage, process_group,
                                      grad_reduce_in_fp32=ddp_config.grad_reduce_in_fp32,
                                      is_unit=is_unit)
        return wrapped, ShardedOptimizer(optimizer_config, wrapped), None

    sharded = zero_stage == 1
    ddp = DistributedDataParallel(
        model, dataclasses.replace(ddp_config, use_distributed_optimizer=sharded), process_group)
    optimizer = get_optimizer(dataclasses.replace(
        optimizer_config, use_distributed_optimizer=sharded,
        overlap_step=comm_hook == "overlap_optim"), ddp)
    if comm_hook == "bf16":
        default_hook = reduce_scatter_hook if sharded else allreduce_hook
        ddp.register_comm_hook(ddp.process_group, bf16_compress_wrapper(default_hook))
    if comm_hook == "powersgd":
        if powersgd_state is None:
            raise ValueError("comm_hook='powersgd' needs a PowerSGDState (powersgd_state=...)")
        ddp.register_comm_hook(powersgd_state, powerSGD_hook)
        return ddp, optimizer, powersgd_state
    return ddp, optimizer, None

