"""`--comm_hook`: how our DDP reduces gradient buckets, and what of it a checkpoint must keep.

    allreduce      DDP's default: all-reduce (ZeRO-1: reduce-scatter) in the gradient dtype
    bf16           the same collective on a bf16 copy: half the bytes, 8-bit mantissa sums
    powersgd       low-rank compression with error feedback (Vogels et al. 2019); its state
                   (error feedback, Q matrices, step counter) differs per rank and is saved
                   in each rank's checkpoint file, or a resumed run would not be identical
    overlap_optim  the optimizer steps bucket by bucket as reductions finish; the hook then
                   owns the optimizer, so the loop steps the hook's optimizer object
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parallel.distributed_data_parallel.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    bf16_compress_wrapper,
    reduce_scatter_hook,
)


@dataclass
class CommHookSetup:
    optimizer: Any          # what the training loop calls step() on
    state: Any = None       # hook state with state_dict()/load_state_dict(), if it has any

    def state_dict(self) -> dict[str, Any] | None:
        return self.state.state_dict() if hasattr(self.state, "state_dict") else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is not None and hasattr(self.state, "load_state_dict"):
            self.state.load_state_dict(state)


def setup_comm_hook(cfg: Any, ddp: Any, optimizer: Any) -> CommHookSetup:
    if cfg.comm_hook == "allreduce":
        return CommHookSetup(optimizer)
    default_hook = reduce_scatter_hook if cfg.use_distributed_optimizer else allreduce_hook
    if cfg.comm_hook == "bf16":
        ddp.register_comm_hook(ddp.process_group, bf16_compress_wrapper(default_hook))
        return CommHookSetup(optimizer)
    raise ValueError(f"--comm_hook={cfg.comm_hook} is not available in this build")
