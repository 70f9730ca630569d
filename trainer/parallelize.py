"""How the model is spread over ranks and updated: our DDP around it, the optimizer, and the
`--comm_hook`, built from the trainer's `parallel`, `optimization` and `system` option groups in
this one place (torchtitan's `parallelize_llama` is the pattern): a new parallelism plan plugs
in here, and the loop keeps calling the same `Parallelized` objects.

`--context_parallel C` gives the model one hook (`shard_sequences`: it then computes this
rank's share of every sequence, parallel/context_parallel/context_shard.py) and changes nothing
else here: the gradients are averaged, and every ZeRO stage shards, over the dp x cp group,
which without a tensor/pipeline grid is every rank, DDP's default (docs/design.md section 8.4a).

`--zero_stage` picks the wrapper and optimizer (optimizer/data_parallel_factory.py): 0 our DDP,
1 the same with the optimizer state sharded (ZeRO-1, also spelled --use_distributed_optimizer),
2 ShardedDataParallel with gradients sharded too, 3 with parameters sharded too. At stage 3 a
rank holds only its shard of each weight between forwards, so whatever reads the whole weights
outside a forward (sample generation on rank 0, saving, the NaN check) runs inside
`Parallelized.whole_params()`, which every rank enters.

`--comm_hook` picks how DDP reduces each gradient bucket (stages 0 and 1 only):

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

import contextlib
import dataclasses
import inspect
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from optimizer import OptimizerConfig, TrainingOptimizer
from optimizer.data_parallel_factory import build_data_parallel
from parallel.context_parallel.context_shard import ContextShard
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.distributed_data_parallel.ddp_comm_hooks.powerSGD_hook import PowerSGDState
from parallel.parallel_dims import ParallelDims
from parallel.pipeline_parallel.schedules import PipelineSchedule
from parallel.sharded_data_parallel import ShardedDataParallel
from parallel_plan.llama_shapes import check_parallel_shapes
from parallel_plan.llama_units import zero_units
from trainer.forward_steps import Batch, CausalLM, ForwardStep
from trainer.model_parallel import (
    PipelinedBase,
    PipelinedEval,
    parallelize_grid,
    pipelined_forward_backward,
    split_reference,
    whole_model_on_rank0,
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
# OptimizerConfig.overlap_step <- --comm_hook=overlap_optim;
# use_distributed_optimizer <- --zero_stage == 1 (or the flag itself).


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


def effective_zero_stage(parallel: ParallelOptions) -> int:
    """--zero_stage, with --use_distributed_optimizer read as stage 1 (the combinations were
    checked once, before any work: trainer/option_validation.py)."""
    return max(parallel.zero_stage, int(parallel.use_distributed_optimizer))


def optimizer_layout(parallel: ParallelOptions) -> str:
    """How this run's optimizer state is saved: a key of training_checkpoint's
    OPTIMIZER_LAYOUTS (what a resume can read is checked before any work)."""
    grid = parallel.tensor_parallel * parallel.pipeline_parallel
    if effective_zero_stage(parallel) > 0 or grid > 1:
        return "sharded"
    return "overlapped" if parallel.comm_hook == "overlap_optim" else "replicated"


@dataclass
class Parallelized:
    """What the loop steps: the wrapped model, its optimizer, the comm-hook state a checkpoint
    must save (None when the hook keeps none), on a tensor/pipeline grid the grid and its
    schedule (trainer/model_parallel.py), and with context parallelism this rank's place in
    its group (the model computes its share of every sequence)."""

    ddp: DistributedDataParallel | ShardedDataParallel
    optimizer: TrainingOptimizer
    comm_hook_state: PowerSGDState | None
    zero_stage: int = 0
    dims: ParallelDims | None = None
    schedule: PipelineSchedule | None = None
    context: ContextShard | None = None

    def forward_backward(self, forward_step: ForwardStep, micro_batches: list[Batch]
                         ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Forward and backward of every micro-batch, gradients accumulated (reduced over
        ranks on the last one); the summed loss and task extras."""
        if self.schedule is not None:  # the pipeline runs its own micro-batch loop
            return pipelined_forward_backward(self.schedule, forward_step, micro_batches)
        loss_sum = torch.zeros((), device=next(iter(micro_batches[0].values())).device)
        extra_sums: dict[str, torch.Tensor] = {}
        for index, batch in enumerate(micro_batches):
            last_micro_batch = index == len(micro_batches) - 1
            with contextlib.nullcontext() if last_micro_batch else self.ddp.no_sync():
                loss, extras = forward_step(self.ddp.module, batch)
                self.optimizer.scale_loss(loss / len(micro_batches)).backward()
            loss_sum += loss.detach().float()
            for key, value in extras.items():
                extra_sums[key] = extra_sums.get(key, 0.0) + value.detach().float()
        return loss_sum, extra_sums

    @contextlib.contextmanager
    def whole_model(self) -> Iterator[torch.nn.Module | None]:
        """The model with every weight whole, for one rank alone to generate from or save:
        collective (every rank enters; ZeRO-3 gathers its shards first, then a grid rebuilds
        the model from its stages and slices on rank 0 and yields None elsewhere)."""
        gathered = self.ddp.gathered_params() if self.zero_stage == 3 else contextlib.nullcontext()
        with gathered:
            if self.dims is not None:  # a fresh whole model: no slices, no ring
                with whole_model_on_rank0(self.ddp.module, self.dims) as whole:
                    yield whole
            elif self.context is not None:  # rank 0 alone generates: whole sequences, no ring
                self.ddp.module.model.context_parallel = None
                try:
                    yield self.ddp.module
                finally:
                    self.ddp.module.model.context_parallel = self.context
            else:
                yield self.ddp.module

    def split_like_policy(self, reference: torch.nn.Module) -> Any:
        """DPO's frozen reference, run as the policy is: on a grid cut into the same stage and
        slices (trainer/model_parallel.py), else whole; with context parallelism on its
        share of every sequence."""
        reference.model.context_parallel = self.context
        return reference if self.schedule is None else split_reference(reference, self.schedule)

    @property
    def base_of_policy(self) -> PipelinedBase | None:
        """LoRA DPO's reference on a grid: the policy's stages with the adapters off (None
        without a grid: the policy itself is called, model/lora.py's `adapters_disabled`)."""
        return None if self.schedule is None else PipelinedBase(self.schedule)

    @property
    def eval_model(self) -> CausalLM:
        """What the evaluator calls like a model: forward only through the stages on a grid."""
        return self.ddp.module if self.schedule is None else PipelinedEval(self.schedule)


def parallelize(model: torch.nn.Module, parallel: ParallelOptions,
                optimization: OptimizationOptions, system: SystemOptions, dtype_name: str
                ) -> Parallelized:
    """The data-parallel wrapper around `model` (already on its device, in its dtype), the
    optimizer and the comm hook, as the options say; on a tensor/pipeline grid the model is
    split first (trainer/model_parallel.py)."""
    options = {**asdict(parallel), **asdict(optimization), **asdict(system)}
    stage = effective_zero_stage(parallel)
    sharded_optimizer = stage == 1
    ddp_config = from_options(DistributedDataParallelConfig, options,
                              use_distributed_optimizer=sharded_optimizer)
    optimizer_config = from_options(OptimizerConfig, options, params_dtype=dtype_name,
                                    use_distributed_optimizer=sharded_optimizer,
                                    overlap_step=parallel.comm_hook == "overlap_optim")
    if parallel.tensor_parallel * parallel.pipeline_parallel > 1:
        # The schedule sums a tied embedding's two copies after the last backward, before
        # DDP reduces them: no bucket may start reducing during that backward.
        ddp_config = dataclasses.replace(ddp_config, overlap_grad_reduce=False)
        ddp, optimizer, schedule, dims = parallelize_grid(
            model, parallel.tensor_parallel, parallel.pipeline_parallel,
            parallel.sequence_parallel, parallel.pp_schedule, stage, parallel.comm_hook,
            ddp_config, optimizer_config, context_parallel=parallel.context_parallel)
        return Parallelized(ddp, optimizer, None, stage, dims, schedule,
                            shard_sequences(model, dims))
    context = None
    if parallel.context_parallel > 1:  # the dp x cp group is every rank: DDP's default
        check_parallel_shapes(model.config, dist.get_world_size(),
                              context_parallel=parallel.context_parallel)
        context = shard_sequences(model, ParallelDims(
            dist.get_world_size(), context_parallel=parallel.context_parallel).build_groups())
    powersgd_state = (from_options(PowerSGDState, options, process_group=None)
                      if parallel.comm_hook == "powersgd" else None)
    wrapped, optimizer, hook_state = build_data_parallel(
        model, stage, ddp_config, optimizer_config, comm_hook=parallel.comm_hook,
        powersgd_state=powersgd_state, is_unit=zero_units(model))
    return Parallelized(wrapped, optimizer, hook_state, stage, context=context)


def shard_sequences(model: torch.nn.Module, dims: ParallelDims) -> ContextShard | None:
    """Context parallelism's one change to the model: from now on it computes this rank's share
    of every sequence it is given (parallel/context_parallel/context_shard.py); None when the
    grid has no context-parallel dimension."""
    if dims.context_parallel == 1:
        return None
    context = ContextShard.of(dims.cp_group)
    model.model.context_parallel = context
    return context
