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
    grad norm         ||g||^2 summed over the TP and PP groups: TP-split tensors add their
                      shards, replicated ones (norm weights) count once (1/T from each of T
                      ranks), the tied embedding's second copy (last stage) not at all; with
                      ZeRO-1/2/3 also over the dp x cp group, which the state is sharded over
                      (each rank holds its shard's)
    whole weights     gathered to rank 0 and loaded into a whole model there
                      (parallel/layout_neutral_checkpoint.py): samples and model.safetensors;
                      ZeRO-3 first gathers each stage's shards (`gathered_params`)
    optimizer state   gathered whole into one ZeRO-1 shard file, loaded on any grid (any
                      --zero_stage), or by a data-parallel run of any size and --zero_stage,
                      and the other way (plain DDP's optimizer.pt read by parameter name)
                      (trainer/grid_optimizer_checkpoint.py): --resume may change
                      --tensor_parallel / --pipeline_parallel (and the data-parallel size,
                      as any world-size change: the data position carries over)
    evaluation        a forward-only pass through the stages (`PipelinedEval`)
    DPO               the frozen reference cut like the policy (`split_reference`; with
                      LoRA the policy's own stages, adapters off: `PipelinedBase`); each
                      micro-batch's reference log-probs come first (forward only through the
                      reference's stages), then the schedule runs the policy with DPO's
                      objective on the last stage, from vocab-parallel token log-probs
                      (`pipelined_forward_backward`)
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from model.lora import apply_lora, lora_config_of
from model.modeling_z2all import Z2allForCausalLM
from optimizer import OptimizerConfig
from optimizer.clip_grads import clip_grads_
from optimizer.data_parallel_factory import build_data_parallel
from optimizer.optimizer import MixedPrecisionOptimizer
from parallel.context_parallel.context_shard import ContextShard
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.layout_neutral_checkpoint import gather_full_tensors
from parallel.parallel_dims import ParallelDims
from parallel.pipeline_parallel.schedules import PipelineSchedule, PipelineStepStats
from parallel.sharded_data_parallel import ShardedDataParallel
from parallel_plan.llama_pipeline import llama_stage, split_into_stage, tied_embedding_param
from parallel_plan.llama_shapes import check_parallel_shapes
from parallel_plan.llama_tensor_parallel import layout_for, layouts_of, parallelize_model
from parallel_plan.llama_units import zero_units
from trainer.forward_steps import (
    Batch,
    DPOStep,
    ForwardStep,
    as_base_model,
    language_model_objective,
)
from trainer.grid_optimizer_checkpoint import (
    GRID_OPTIMIZER_FILES,
    NamedPieces,
    load_grid_optimizer,
    save_grid_optimizer,
)

TIED_EMBEDDING = "model.embed_tokens.weight"


@dataclass(frozen=True)
class DataShare:
    """Which part of each global batch this rank reads: on a grid the T x P x C ranks of one
    data-parallel replica read the same batches (with context parallelism each then computes
    its share of every sequence: parallel/context_parallel/context_shard.py), and one of them
    counts their tokens. `sequence_multiple`: every batch's length is a multiple of it (2C:
    context parallelism cuts each sequence into 2C equal chunks)."""

    rank: int
    world_size: int
    counts_tokens: bool
    sequence_multiple: int = 1


def data_share(rank: int, world_size: int, tensor_parallel: int, pipeline_parallel: int,
               context_parallel: int = 1) -> DataShare:
    """ValueError (one line) when the world does not divide into the grid."""
    dims = ParallelDims(world_size, tensor_parallel, pipeline_parallel, context_parallel,
                        rank=rank)
    counts_tokens = dims.tp_rank == 0 and dims.pp_rank == 0 and dims.cp_rank == 0
    return DataShare(dims.dp_rank, dims.data_parallel, counts_tokens,
                     sequence_multiple=2 * context_parallel if context_parallel > 1 else 1)


def data_leader_ranks(world_size: int, tensor_parallel: int, pipeline_parallel: int,
                      context_parallel: int = 1) -> list[int]:
    """One global rank per data-parallel replica, in dp order (their data states are the
    replicas'; the other ranks of a replica hold copies)."""
    dims = ParallelDims(world_size, tensor_parallel, pipeline_parallel, context_parallel)
    return [dims.rank_of(0, dp, 0, 0) for dp in range(dims.data_parallel)]


def saved_data_leader_ranks(trainer_state: dict[str, Any]) -> list[int]:
    """`data_leader_ranks` of the grid a checkpoint was saved on (from its trainer state, so a
    run resumed on another grid reads the right ranks' data states)."""
    saved = trainer_state["config"]
    return data_leader_ranks(trainer_state["world_size"], saved.get("tensor_parallel", 1),
                             saved.get("pipeline_parallel", 1), saved.get("context_parallel", 1))


class GridOptimizer:
    """The data-parallel optimizer (replicated, or sharded over the dp x cp group: ZeRO-1/2/3)
    with whole-model clipping and layout-neutral checkpoints (module docstring): a
    `TrainingOptimizer` (optimizer/factory.py) whose other calls go to the inner one."""

    def __init__(self, inner: MixedPrecisionOptimizer, model: Z2allForCausalLM,
                 dims: ParallelDims, max_norm: float) -> None:
        self.inner, self.model, self.dims, self.max_norm = inner, model, dims, max_norm
        # The last stage's copy of a tied embedding (the first stage counts the original).
        self._tied_copy = (tied_embedding_param(model, dims)
                           if dims.is_last_stage and not dims.is_first_stage else None)
        self._norm_weight = {  # each element of the whole model counted once
            param: 0.0 if param is self._tied_copy
            else 1.0 if dims.tensor_parallel > 1 and layout_for(name, model.config)
            else 1.0 / dims.tensor_parallel
            for name, param in model.named_parameters()}

    def set_lr(self, lr: float) -> None:
        self.inner.set_lr(lr)

    def zero_grad(self) -> None:
        self.inner.zero_grad()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.inner.scale_loss(loss)

    def finish_param_sync(self) -> None:
        self.inner.finish_param_sync()

    def state_bytes(self) -> int:
        return self.inner.state_bytes()

    def _owned_grads(self) -> list[torch.Tensor]:
        """The averaged gradient (after finish_grad_sync) of each piece this rank updates:
        whole `main_grad`s, or under ZeRO-1/2/3 the parts in this rank's shard (only those
        were reduce-scattered to it)."""
        return [piece.grad for piece in self.inner.main_pieces()]

    def grad_norm(self) -> float:
        """||g|| of the whole model: this rank's owned gradients, squared and weighted, summed
        over the TP and PP groups (and over the dp x cp group when ZeRO shards them over it;
        without ZeRO the cp ranks hold the same averaged gradients, counted once)."""
        pieces = self.inner.main_pieces()
        norms = torch.stack(torch._foreach_norm([piece.grad for piece in pieces], 2.0)).double()
        weights = torch.tensor([self._norm_weight[piece.param] for piece in pieces],
                               dtype=torch.float64, device=norms.device)
        squares = (norms.square() * weights).sum()
        groups = [self.dims.tp_group, self.dims.pp_group]
        if self.inner.grads_sharded:
            groups.append(self.dims.dp_cp_group)
        for group in groups:
            dist.all_reduce(squares, group=group)
        return float(squares.sqrt())

    def step(self) -> tuple[bool, float]:
        """Clip by the whole model's norm, then the inner step (built with clip_grad=0)."""
        grad_norm = self.grad_norm()
        if not math.isfinite(grad_norm):
            return False, grad_norm
        if self.max_norm > 0:
            clip_grads_(self._owned_grads(), self.max_norm, grad_norm)
        stepped, _ = self.inner.step()
        return stepped, grad_norm

    # ---- checkpoints: layout-neutral, in ZeRO-1's shard-file format (module docstring) --------
    def _named_pieces(self) -> NamedPieces:
        """{whole-model name: (this rank's trainable parameter, its pieces this rank
        updates)}; a frozen one (a LoRA base's) has no optimizer state. The last stage's copy
        of a tied embedding goes by the embedding's name: its state is the same, saved once."""
        named = {param: (TIED_EMBEDDING if param is self._tied_copy else name, [])
                 for name, param in self.model.named_parameters() if param.requires_grad}
        for piece in self.inner.main_pieces():
            named[piece.param][1].append(piece)
        return {name: (param, pieces) for param, (name, pieces) in named.items()}

    def save_checkpoint(self, optim_dir: str | Path) -> None:
        save_grid_optimizer(self.inner, self._named_pieces(), self.model.config, self.dims,
                            Path(optim_dir), lora=lora_config_of(self.model))

    def checkpoint_files(self) -> list[str]:
        return GRID_OPTIMIZER_FILES

    def load_checkpoint(self, optim_dir: str | Path) -> None:
        load_grid_optimizer(self.inner, self._named_pieces(), self.model.config, self.dims,
                            Path(optim_dir), lora=lora_config_of(self.model))


class PipelinedEval:
    """`model(input_ids, labels=..., attention_mask=...).loss` and `model.token_log_probs(...)`
    through the stages, forward only, the result on every rank: a `CausalLM`
    (trainer/forward_steps.py) for the evaluator and DPO's frozen reference."""

    def __init__(self, schedule: PipelineSchedule) -> None:
        self.schedule = schedule

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, labels: torch.Tensor,
                 attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        batch = {"input_ids": input_ids, "labels": labels}
        if attention_mask is not None:
            batch["attention_mask"] = attention_mask
        return SimpleNamespace(loss=self.schedule.forward_only(batch))

    def token_log_probs(self, input_ids: torch.Tensor, labels: torch.Tensor,
                        attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch = {"input_ids": input_ids, "labels": labels}
        if attention_mask is not None:
            batch["attention_mask"] = attention_mask
        return self.schedule.forward_only(batch, per_token=True)


class PipelinedBase(PipelinedEval):
    """LoRA DPO's reference on a grid: the policy's own stages as its frozen base (adapters
    off, eval mode), forward only; no second model, as in one process."""

    def token_log_probs(self, input_ids: torch.Tensor, labels: torch.Tensor,
                        attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        with as_base_model(self.schedule.model):
            return super().token_log_probs(input_ids, labels, attention_mask)


def split_reference(reference: Z2allForCausalLM, policy_schedule: PipelineSchedule
                    ) -> PipelinedEval:
    """DPO's frozen reference (whole, as loaded) cut exactly like the policy: the same stage
    and tensor slices on this rank, run forward-only through the same stages."""
    dims = policy_schedule.dims
    split_into_stage(reference, dims)
    if dims.tensor_parallel > 1:
        parallelize_model(reference, dims, policy_schedule.sequence_parallel)
    reference.requires_grad_(False)
    return PipelinedEval(PipelineSchedule(llama_stage(reference, dims), dims,
                                          policy_schedule.schedule,
                                          policy_schedule.sequence_parallel))


def pipelined_forward_backward(schedule: PipelineSchedule, forward_step: ForwardStep,
                               micro_batches: list[Batch]
                               ) -> tuple[torch.Tensor, dict[str, float]]:
    """The grid's stand-in for the micro-batch loop: (summed loss, summed task metrics), each
    micro-batch's share of the global batch's (trainer/global_batch.py). DPO first computes
    every micro-batch's reference log-probs (forward only through the reference's stages),
    then the schedule runs the policy with DPO's objective on the last stage, from
    vocab-parallel token log-probs (no gathered logits)."""
    if isinstance(forward_step, DPOStep):
        micro_batches = [forward_step.with_reference(schedule.model, batch)
                         for batch in micro_batches]
        loss = schedule.step(micro_batches, forward_step.objective, per_token=True)
    else:
        loss = schedule.step(micro_batches, language_model_objective)
    return loss, schedule.last_step_extras


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
        reference.model.context_parallel = self.context
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


def shard_sequences(model: Z2allForCausalLM, dims: ParallelDims) -> ContextShard | None:
    """Context parallelism's one change to the model: from now on it computes this rank's share
    of every sequence it is given (parallel/context_parallel/context_shard.py); None when the
    grid has no context-parallel dimension."""
    if dims.context_parallel == 1:
        return None
    context = ContextShard.of(dims.cp_group)
    model.model.context_parallel = context
    return context


def parallelize_grid(model: Z2allForCausalLM, tensor_parallel: int, pipeline_parallel: int,
                     sequence_parallel: bool, pp_schedule: str, zero_stage: int, comm_hook: str,
                     ddp_config: DistributedDataParallelConfig,
                     optimizer_config: OptimizerConfig, context_parallel: int = 1) -> GridRun:
    """The module docstring's steps. `comm_hook` allreduce or bf16 (the option check refuses
    the rest on a grid): the same wrapper and optimizer as data parallelism alone
    (optimizer/data_parallel_factory.py), over the dp group (with context parallelism the
    dp x cp group: its ranks hold the same weights and see different tokens, and the model
    computes its share of the sequences)."""
    check_parallel_shapes(model.config, dist.get_world_size(), tensor_parallel,
                          pipeline_parallel, sequence_parallel, context_parallel=context_parallel)
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
