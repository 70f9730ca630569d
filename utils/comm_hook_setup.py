"""`--comm_hook`: how our DDP reduces gradient buckets, and what of it a checkpoint must keep.

    allreduce      DDP's default: all-reduce (ZeRO-1: reduce-scatter) in the gradient dtype
    bf16           the same collective on a bf16 copy: half the bytes, 8-bit mantissa sums
    powersgd       low-rank compression with error feedback (Vogels et al. 2019); its state
                   (error feedback, Q matrices, step counter) differs per rank and is saved
                   in each rank's checkpoint file, or a resumed run would not be identical
    overlap_optim  AdamW steps bucket by bucket as each reduction finishes; the optimizer *is*
                   the hook (OverlappedAdamW registers itself), so it replaces get_optimizer's
"""

from __future__ import annotations

from typing import Any

from optimizer import OptimizerConfig, get_optimizer
from parallel.distributed_data_parallel.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    bf16_compress_wrapper,
    reduce_scatter_hook,
)
from parallel.distributed_data_parallel.ddp_comm_hooks.overlap_optim_step_hooks import (
    OverlappedAdamW,
)
from parallel.distributed_data_parallel.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    powerSGD_hook,
)


def build_optimizer_and_comm_hook(cfg: Any, ddp: Any, optimizer_config: OptimizerConfig
                                  ) -> tuple[Any, PowerSGDState | None]:
    """(the optimizer the loop steps, the hook state a checkpoint must save or None)."""
    if cfg.comm_hook == "overlap_optim":
        return OverlappedAdamW.from_config(optimizer_config, ddp), None
    optimizer = get_optimizer(optimizer_config, ddp)
    if cfg.comm_hook == "allreduce":
        return optimizer, None
    if cfg.comm_hook == "bf16":
        default_hook = reduce_scatter_hook if cfg.use_distributed_optimizer else allreduce_hook
        ddp.register_comm_hook(ddp.process_group, bf16_compress_wrapper(default_hook))
        return optimizer, None
    if cfg.comm_hook == "powersgd":
        state = PowerSGDState(ddp.process_group, matrix_approximation_rank=cfg.powersgd_rank,
                              start_powerSGD_iter=cfg.powersgd_warmup_iters, seed=cfg.seed)
        ddp.register_comm_hook(state, powerSGD_hook)
        return optimizer, state
    raise ValueError(f"unknown --comm_hook={cfg.comm_hook}")
