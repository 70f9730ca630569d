"""How the model is spread over ranks and updated: our DDP around it, the optimizer, and the
`--comm_hook`, built from the trainer's `parallel`, `optimization` and `system` option groups in
this one place (torchtitan's `parallelize_llama` is the pattern): a new parallelism plan plugs
in here, and the loop keeps calling the same `ParallelRun` protocol: `DataParallelRun` below,
or `GridRun` on a tensor/pipeline grid (trainer/model_parallel.py).

`--context_parallel C` gives the model one hook (`shard_sequences` calls its
`use_sequence_shard`: it then computes this rank's share of every sequence,
parallel/context_parallel/context_shard.py) and changes nothing else here: the gradients are
averaged, and every ZeRO stage shards, over the dp x cp group, which without a tensor/pipeline
grid is every rank, DDP's default (docs/design.md section 8.4a).

`--zero_stage` picks the wrapper and optimizer (optimizer/data_parallel_factory.py): 0 our DDP,
1 the same with the optimizer state sharded (ZeRO-1, also spelled --use_distributed_optimizer),
2 ShardedDataParallel with gradients sharded too, 3 with parameters sharded too. At stage 3 a
rank holds only its shard of each weight between forwards, so whatever reads the whole weights
outside a forward (sample generation on rank 0, saving, the NaN check) runs inside
`ParallelRun.whole_model()`, which every rank enters.

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
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from optimizer import OptimizerConfig, TrainingOptimizer
from optimizer.data_parallel_factory import build_data_parallel, zero_stage_of
from optimizer.optimizer import DataParallelModel
from parallel.context_parallel.context_shard import ContextShard
from parallel.distributed_data_parallel import (
    DistributedDataParallelConfig,
)
from parallel.distributed_data_parallel.ddp_comm_hooks.powerSGD_hook import PowerSGDState
from parallel.parallel_dims import ParallelDims
from parallel.pipeline_parallel.schedules import PipelineStepStats
from parallel_plan.llama_shapes import check_parallel_shapes
from parallel_plan.llama_units import zero_units
from trainer.forward_steps import CausalLM, ForwardStep
from trainer.global_batch import Batch
from trainer.model_parallel import GridRun, parallelize_grid
from trainer.options import OptimizationOptions, ParallelOptions, SystemOptions
from trainer.sequence_sharding import shard_sequences

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
    return zero_stage_of(parallel.zero_stage, parallel.use_distributed_optimizer)


class ParallelRun(Protocol):
    """What the loop, the evaluator, checkpoints and DPO's reference need of the layout the run
    trains on, whatever it is: `DataParallelRun` below, or on a tensor/pipeline grid
    `GridRun` (trainer/model_parallel.py)."""

    ddp: DataParallelModel  # the data-parallel wrapper (GradientSync, comm bytes, memory)
    optimizer: TrainingOptimizer
    comm_hook_state: PowerSGDState | None  # what a checkpoint must save of the comm hook
    zero_stage: int
    dims: ParallelDims
    context: ContextShard | None  # this rank's place in its context-parallel group

    def forward_backward(self, forward_step: ForwardStep, micro_batches: list[Batch]
                         ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Forward and backward of every micro-batch, gradients accumulated (reduced over
        ranks on the last one); the summed loss and task extras: the micro-batches' shares of
        the global batch's (trainer/global_batch.py), which the loop put in each batch."""

    def whole_model(self) -> AbstractContextManager[torch.nn.Module | None]:
        """Collective (every rank enters): the model with every weight whole, for one rank
        alone to generate from or save; None on the ranks that do not hold it."""

    def split_like_policy(self, reference: torch.nn.Module) -> CausalLM:
        """DPO's frozen reference, run as the policy is (same stage and slices, same share of
        every sequence)."""

    @property
    def base_of_policy(self) -> CausalLM | None:
        """LoRA DPO's reference when it is not the policy module itself, else None."""

    @property
    def eval_model(self) -> CausalLM:
        """What the evaluator calls like a model."""

    def pipeline_stats(self) -> PipelineStepStats | None:
        """The last step's pipeline bubble, None without a pipeline."""


@dataclass
class DataParallelRun:
    """Data parallelism alone (over dp x cp with context parallelism): the whole model on every
    rank (ZeRO-2/3 shards it between uses), one micro-batch loop with the wrapper's
    `no_sync()` on all but the last."""

    ddp: DataParallelModel
    optimizer: TrainingOptimizer
    comm_hook_state: PowerSGDState | None
    zero_stage: int
    dims: ParallelDims
    context: ContextShard | None = None

    def forward_backward(self, forward_step: ForwardStep, micro_batches: list[Batch]
                         ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss_sum = torch.zeros((), device=next(iter(micro_batches[0].values())).device)
        extra_sums: dict[str, torch.Tensor] = {}
        for index, batch in enumerate(micro_batches):
            last_micro_batch = index == len(micro_batches) - 1
            with contextlib.nullcontext() if last_micro_batch else self.ddp.no_sync():
                loss, extras = forward_step(self.ddp.module, batch)  # its share: no 1/M
                self.optimizer.scale_loss(loss).backward()
            loss_sum += loss.detach().float()
            for key, value in extras.items():
                extra_sums[key] = extra_sums.get(key, 0.0) + value.detach().float()
        return loss_sum, extra_sums

    @contextlib.contextmanager
    def whole_model(self) -> Iterator[torch.nn.Module]:
        """Every rank holds the model (ZeRO-3 gathers its shards first); with context
        parallelism the ring is off inside, as rank 0 alone generates whole sequences."""
        module = self.ddp.module
        with self.ddp.gathered_params(), module.whole_sequences():
            yield module

    def split_like_policy(self, reference: torch.nn.Module) -> CausalLM:
        reference.use_sequence_shard(self.context)
        return reference

    @property
    def base_of_policy(self) -> None:
        """The policy module itself is called with its adapters off (model/lora.py)."""
        return None

    @property
    def eval_model(self) -> CausalLM:
        return self.ddp.module

    def pipeline_stats(self) -> None:
        return None


def parallelize(model: torch.nn.Module, parallel: ParallelOptions,
                optimization: OptimizationOptions, system: SystemOptions, dtype_name: str
                ) -> DataParallelRun | GridRun:
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
    # One check of the model's shapes against the layout, whatever it is (a no-op for data
    # parallelism alone): the option check made it on the planned config, this on the model.
    check_parallel_shapes(model.config, dist.get_world_size(), parallel.tensor_parallel,
                          parallel.pipeline_parallel, parallel.sequence_parallel,
                          context_parallel=parallel.context_parallel)
    if parallel.tensor_parallel * parallel.pipeline_parallel > 1:
        # The schedule sums a tied embedding's two copies after the last backward, before
        # DDP reduces them: no bucket may start reducing during that backward.
        ddp_config = dataclasses.replace(ddp_config, overlap_grad_reduce=False)
        return parallelize_grid(
            model, parallel.tensor_parallel, parallel.pipeline_parallel,
            parallel.sequence_parallel, parallel.pp_schedule, stage, parallel.comm_hook,
            ddp_config, optimizer_config, context_parallel=parallel.context_parallel)
    dims = ParallelDims(dist.get_world_size(), context_parallel=parallel.context_parallel,
                        rank=dist.get_rank())
    if parallel.context_parallel > 1:  # the dp x cp group is every rank: DDP's default
        dims.build_groups()
    powersgd_state = (from_options(PowerSGDState, options, process_group=None)
                      if parallel.comm_hook == "powersgd" else None)
    wrapped, optimizer, hook_state = build_data_parallel(
        model, stage, ddp_config, optimizer_config, comm_hook=parallel.comm_hook,
        powersgd_state=powersgd_state, is_unit=zero_units(model))
    return DataParallelRun(wrapped, optimizer, hook_state, stage, dims,
                           shard_sequences(model, dims))
