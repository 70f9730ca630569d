"""Tensor and pipeline parallelism in the trainer: the model split over a device grid.

With `--tensor_parallel T --pipeline_parallel P` the W ranks form a grid of P stages x D
data-parallel replicas x T tensor shards (parallel/parallel_dims.py). `parallelize_grid`:

    Step 1  the process groups of each dimension (collective);
    Step 2  the whole model, built with the same seed (or loaded) on every rank, cut to this
            rank's stage, then its matrices to this rank's shard (parallel/pipeline_parallel,
            parallel/tensor_parallel);
    Step 3  the data-parallel wrapper of this stage's (sliced) module over the data-parallel
            group only, by the same factory as data parallelism alone: our DDP (gradients
            reduced once per step in finish_grad_sync: all-reduce, or with --zero_stage=1
            reduce-scatter, optionally of a bf16 copy, --comm_hook=bf16), or with
            --zero_stage 2/3 ShardedDataParallel (gradients, and at 3 the weights, sharded;
            its units: this stage's blocks, and a tied embedding's copy alone, so that both
            stages shard it alike); the schedule drives it through `GradientSync`
            (parallel/gradient_sync.py);
    Step 4  the optimizer (ZeRO-1/2/3: its state sharded over the group that averages the
            gradients, dp x cp: the data-parallel group without context parallelism),
            wrapped so that clipping uses the norm of the *whole* model.

Every rank of one data-parallel replica sees the same batches (the data is split by dp rank).
What differs from a data-parallel run, and how the loop is kept the same:

    forward/backward  `PipelineSchedule.step(micro_batches)` (afab or 1f1b) instead of the
                      micro-batch loop (`GridRun.forward_backward`)
    grad norm         of the whole model, over the TP and PP groups (`GridOptimizer`,
                      trainer/grid_optimizer.py)
    whole weights     gathered to rank 0 and loaded into a whole model there
                      (parallel/layout_neutral_checkpoint.py): samples and model.safetensors;
                      ZeRO-3 first gathers each stage's shards (`gathered_params`)
    optimizer state   layout-neutral: --resume may change --tensor_parallel /
                      --pipeline_parallel and the data-parallel size
                      (trainer/grid_optimizer.py, trainer/grid_optimizer_checkpoint.py)
    evaluation, DPO   forward passes through the stages (trainer/pipelined_forward.py)

Which batches a rank reads: trainer/data_share.py; context parallelism's one change to the
model: trainer/sequence_sharding.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from model.lora import apply_lora, lora_config_of
from model.modeling_z2all import Z2allForCausalLM
from optimizer import OptimizerConfig
from optimizer.data_parallel_factory import build_data_parallel
from parallel.context_parallel.context_shard import ContextShard
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.layout_neutral_checkpoint import gather_full_tensors
from parallel.parallel_dims import ParallelDims
from parallel.pipeline_parallel.schedules import PipelineSchedule, PipelineStepStats
from parallel.sharded_data_parallel import ShardedDataParallel
from parallel_plan.llama_pipeline import llama_stage, split_into_stage
from parallel_plan.llama_tensor_parallel import layouts_of, parallelize_model
from parallel_plan.llama_units import zero_units
from trainer.forward_steps import ForwardStep
from trainer.global_batch import Batch
from trainer.grid_optimizer import GridOptimizer
from trainer.pipelined_forward import (
    PipelinedBase,
    PipelinedEval,
    pipelined_forward_backward,
    split_reference,
)
from trainer.sequence_sharding import shard_sequences


@dataclass
class GridRun:
    """What the loop steps on a tensor/pipeline grid (trainer/parallelize.py's `ParallelRun`):
    the stage's data-parallel wrapper and the grid optimizer, driven through the schedule;
    whole weights rebuilt on rank 0; evaluation and DPO's reference forward-only through the
    stages. With context parallelism each rank computes its share of every sequence."""

    ddp: DistributedDataParallel | ShardedDataParallel
    optimizer: GridOptimizer
    zero_stage: int
    dims: ParallelDims
    schedule: PipelineSchedule
    context: ContextShard | None = None
    comm_hook_state: None = None
    """(powersgd, whose per-rank state a layout-neutral checkpoint cannot hold, is refused on
    a grid)"""

    def forward_backward(self, forward_step: ForwardStep, micro_batches: list[Batch]
                         ) -> tuple[torch.Tensor, dict[str, float]]:
        return pipelined_forward_backward(self.schedule, forward_step, micro_batches)

    @contextlib.contextmanager
    def whole_model(self) -> Iterator[Z2allForCausalLM | None]:
        """Collective: a fresh whole model on rank 0 (no slices, no ring), None elsewhere."""
        with self.ddp.gathered_params(), whole_model_on_rank0(self.ddp.module, self.dims) as whole:
            yield whole

    def split_like_policy(self, reference: Z2allForCausalLM) -> PipelinedEval:
        reference.use_sequence_shard(self.context)
        return split_reference(reference, self.schedule)

    @property
    def base_of_policy(self) -> PipelinedBase:
        return PipelinedBase(self.schedule)

    @property
    def eval_model(self) -> PipelinedEval:
        return PipelinedEval(self.schedule)

    def pipeline_stats(self) -> PipelineStepStats | None:
        """The last step's bubble (theory and measured), None without a pipeline."""
        return self.schedule.last_step_stats if self.dims.pipeline_parallel > 1 else None


def parallelize_grid(model: Z2allForCausalLM, tensor_parallel: int, pipeline_parallel: int,
                     sequence_parallel: bool, pp_schedule: str, zero_stage: int, comm_hook: str,
                     ddp_config: DistributedDataParallelConfig,
                     optimizer_config: OptimizerConfig, context_parallel: int = 1) -> GridRun:
    """The module docstring's steps. `comm_hook` allreduce or bf16 (the option check refuses
    the rest on a grid): the same wrapper and optimizer as data parallelism alone
    (optimizer/data_parallel_factory.py), over the dp group (with context parallelism the
    dp x cp group: its ranks hold the same weights and see different tokens, and the model
    computes its share of the sequences). The model's shapes were checked against the grid
    (`check_parallel_shapes`) by the caller."""
    dims = ParallelDims(dist.get_world_size(), tensor_parallel,  # Step 1
                        pipeline_parallel, context_parallel).build_groups()
    split_into_stage(model, dims)  # Step 2
    if tensor_parallel > 1:
        parallelize_model(model, dims, sequence_parallel)
    ddp, inner, _ = build_data_parallel(  # Steps 3 and 4
        model, zero_stage, ddp_config, dataclasses.replace(optimizer_config, clip_grad=0.0),
        process_group=dims.dp_cp_group, comm_hook=comm_hook,
        is_unit=zero_units(model, dims))
    schedule = PipelineSchedule(llama_stage(model, dims), dims, pp_schedule, sequence_parallel,
                                grad_sync=ddp)
    optimizer = GridOptimizer(inner, model, dims, max_norm=optimizer_config.clip_grad)
    return GridRun(ddp, optimizer, zero_stage, dims, schedule, shard_sequences(model, dims))


@contextlib.contextmanager
def whole_model_on_rank0(model: Z2allForCausalLM, dims: ParallelDims
                         ) -> Iterator[Z2allForCausalLM | None]:
    """Collective: the whole model, rebuilt from every rank's pieces, on rank 0 (None
    elsewhere), for sample generation and model.safetensors (with LoRA: with its adapters, for
    the adapter file). Under ZeRO-3 the caller gathers the stage's shards first
    (`ShardedDataParallel.gathered_params`, as `GridRun.whole_model` does)."""
    full = gather_full_tensors(model.state_dict(), layouts_of(model.config), dims)
    if full is None:
        yield None
        return
    whole = Z2allForCausalLM(model.config).to(next(iter(full.values())).device)
    lora = lora_config_of(model)
    if lora is not None:
        apply_lora(whole, lora)
    whole.load_state_dict(full)
    whole.to(next(iter(full.values())).dtype).eval()
    yield whole
