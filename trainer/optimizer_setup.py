"""Our DDP around the model, the optimizer, and the `--comm_hook`: built from the trainer's
options in one place.

`--comm_hook` picks how DDP reduces each gradient bucket:

    allreduce      DDP's default: all-reduce (ZeRO-1: reduce-scatter) in the gradient dtype
    bf16           the same collective on a bf16 copy: half the bytes, 8-bit mantissa sums
    powersgd       low-rank compression with error feedback (Vogels et al. 2019); its state
                   (error feedback, Q matrices, step counter) differs per rank and is saved
                   in each rank's checkpoint file, or a resumed run would not be identical
    overlap_optim  AdamW steps bucket by bucket as each reduction finishes: the optimizer *is*
                   the hook (`OptimizerConfig.overlap_step`; OverlappedAdamW registers itself)

Each component keeps its own field names (Megatron-LM's and PyTorch's, so their docs read the
same); `OPTION_FOR_FIELD` is the one table of where a trainer option lands under another name,
and every other field is filled from the option of the same name, so no list of fields is
copied by hand.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from optimizer import OptimizerConfig, TrainingOptimizer, get_optimizer
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

# component field -> the trainer option that sets it, where the names differ.
OPTION_FOR_FIELD = {
    "clip_grad": "grad_clip",                              # OptimizerConfig
    "matrix_approximation_rank": "powersgd_rank",         # PowerSGDState
    "start_powerSGD_iter": "powersgd_warmup_iters",       # PowerSGDState
}
# Fields computed from the options rather than copied (passed explicitly below):
# OptimizerConfig.params_dtype <- the resolved --dtype ("auto" becomes fp32/bf16/fp16);
# OptimizerConfig.overlap_step <- --comm_hook=overlap_optim.


def from_options(component: type, cfg: Any, **computed: Any) -> Any:
    """`component(**kwargs)` with every constructor argument that names a trainer option
    (directly or through OPTION_FOR_FIELD) taken from `cfg`; `computed` values win."""
    options = cfg.to_dict()
    kwargs = {}
    for name in inspect.signature(component).parameters:
        option = OPTION_FOR_FIELD.get(name, name)
        if name in computed:
            kwargs[name] = computed[name]
        elif option in options:
            kwargs[name] = options[option]
    return component(**kwargs)


def build_ddp_and_optimizer(cfg: Any, model: torch.nn.Module, dtype_name: str
                            ) -> tuple[DistributedDataParallel, TrainingOptimizer,
                                       PowerSGDState | None]:
    """(our DDP around `model`, the optimizer the loop steps, the hook state a checkpoint must
    save or None)."""
    ddp = DistributedDataParallel(model, from_options(DistributedDataParallelConfig, cfg))
    optimizer = get_optimizer(from_options(OptimizerConfig, cfg, params_dtype=dtype_name,
                                           overlap_step=cfg.comm_hook == "overlap_optim"), ddp)
    if cfg.comm_hook in ("allreduce", "overlap_optim"):
        return ddp, optimizer, None
    if cfg.comm_hook == "bf16":
        default_hook = reduce_scatter_hook if cfg.use_distributed_optimizer else allreduce_hook
        ddp.register_comm_hook(ddp.process_group, bf16_compress_wrapper(default_hook))
        return ddp, optimizer, None
    if cfg.comm_hook == "powersgd":
        state = from_options(PowerSGDState, cfg, process_group=ddp.process_group)
        ddp.register_comm_hook(state, powerSGD_hook)
        return ddp, optimizer, state
    raise ValueError(f"unknown --comm_hook={cfg.comm_hook}")
