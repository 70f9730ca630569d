"""How the model is spread over ranks and updated: our DDP around it, the optimizer, and the
`--comm_hook`, built from the trainer's `parallel`, `optimization` and `system` option groups in
this one place (torchtitan's `parallelize_llama` is the pattern): a new parallelism plan plugs
in here, and the loop keeps calling the same `Parallelized` objects.

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
from dataclasses import asdict, dataclass
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
from trainer.options import OptimizationOptions, ParallelOptions, SystemOptions

# component field -> the trainer option that sets it, where the names differ.
OPTION_FOR_FIELD = {
    "clip_grad": "grad_clip",                              # OptimizerConfig
    "matrix_approximation_rank": "powersgd_rank",         # PowerSGDState
    "start_powerSGD_iter": "powersgd_warmup_iters",       # PowerSGDState
}
# Fields computed from the options rather than copied (passed explicitly below):
# OptimizerConfig.params_dtype <- the resolved --dtype ("auto" becomes fp32/bf16/fp16);
# OptimizerConfig.overlap_step <- --comm_hook=overlap_optim.


def from_options(component: type, options: dict[str, Any], **computed: Any) -> Any:
    """`component(**kwargs)` with every constructor argument that names an option in
    `options` (directly or through OPTION_FOR_FIELD) taken from it; `computed` values win."""
    kwargs = {}
    for name in inspect.signature(component).parameters:
        option = OPTION_FOR_FIELD.get(name, name)
        if name in computed:
            kwargs[name] = computed[name]
        elif option in options:
            kwargs[name] = options[option]
    return component(**kwargs)


@dataclass
class Parallelized:
    """What the loop steps: the wrapped model, its optimizer, and the comm-hook state a
    checkpoint must save (None when the hook keeps none)."""

    ddp: DistributedDataParallel
    optimizer: TrainingOptimizer
    comm_hook_state: PowerSGDState | None


def parallelize(model: torch.nn.Module, parallel: ParallelOptions,
                optimization: OptimizationOptions, system: SystemOptions, dtype_name: str
                ) -> Parallelized:
    """Our DDP around `model` (already on its device, in its dtype), the optimizer and the
    comm hook, as the options say."""
    options = {**asdict(parallel), **asdict(optimization), **asdict(system)}
    ddp = DistributedDataParallel(model, from_options(DistributedDataParallelConfig, options))
    overlap_step = parallel.comm_hook == "overlap_optim"
    optimizer = get_optimizer(from_options(OptimizerConfig, options, params_dtype=dtype_name,
                                           overlap_step=overlap_step), ddp)
    if parallel.comm_hook in ("allreduce", "overlap_optim"):
        return Parallelized(ddp, optimizer, None)
    if parallel.comm_hook == "bf16":
        default_hook = (reduce_scatter_hook if parallel.use_distributed_optimizer
                        else allreduce_hook)
        ddp.register_comm_hook(ddp.process_group, bf16_compress_wrapper(default_hook))
        return Parallelized(ddp, optimizer, None)
    if parallel.comm_hook == "powersgd":
        state = from_options(PowerSGDState, options, process_group=ddp.process_group)
        ddp.register_comm_hook(state, powerSGD_hook)
        return Parallelized(ddp, optimizer, state)
    raise ValueError(f"unknown --comm_hook={parallel.comm_hook}")
