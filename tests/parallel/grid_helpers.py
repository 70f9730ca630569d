"""Train the same tiny model on a device grid and in one process, for the grid tests.

The global batch of each step is split over the data-parallel ranks, then into micro-batches;
the single-process reference averages the same micro-batch losses in the same way, so both
runs compute the same gradients up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from model.modeling_z2all import Z2allForCausalLM
from parallel.context_parallel.context_shard import ContextShard
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.layout_neutral_checkpoint import gather_full_tensors, shard_full_tensors
from parallel.parallel_dims import ParallelDims
from parallel.pipeline_parallel.schedules import PipelineSchedule
from parallel_plan.llama_pipeline import llama_stage, split_into_stage
from parallel_plan.llama_tensor_parallel import layouts_of, parallelize_model
from tests.model.model_helpers import small_model

STEPS, SEQ_LEN, MICRO_BATCH_SIZE, LR = 3, 8, 2, 1e-2
ADAM_EPS = 1e-4
"""Adam's update is about lr * g / (|g| + eps): with the default eps 1e-8 a gradient that is 0
in one run and 1e-9 of rounding noise in the other moves a weight by a whole lr. eps 1e-4
bounds that to lr * 1e-7 / 1e-4 = 1e-5 per step for fp32 rounding of 1e-7."""
ModelBuilder = Callable[[], Z2allForCausalLM]
"""Builds the same whole model on every call (and in every rank): seeded or loaded."""


class Grid(NamedTuple):
    """One row of a grid table; a table's plain tuples may leave out context_parallel."""
    world: int
    tensor_parallel: int
    pipeline_parallel: int
    sequence_parallel: bool
    schedule: str
    micro_batches: int
    context_parallel: int = 1

    @property
    def data_parallel(self) -> int:
        return self.world // (self.tensor_parallel * self.pipeline_parallel
                              * self.context_parallel)


def tiny_model() -> Z2allForCausalLM:
    return small_model("gqa", seed=0)


def micro_batches_of(step: int, data_parallel: int, num_micro: int
                     ) -> list[list[dict[str, torch.Tensor]]]:
    """[dp rank][micro-batch] -> {input_ids, labels, attention_mask}; fresh random tokens."""
    generator = torch.Generator().manual_seed(100 + step)
    rows = data_parallel * num_micro * MICRO_BATCH_SIZE
    input_ids = torch.randint(0, 256, (rows, SEQ_LEN), generator=generator)
    labels = torch.randint(0, 256, (rows, SEQ_LEN), generator=generator)
    labels[::3, :2] = -100  # some untrained positions
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, -2:] = 0  # one right-padded row
    batches = [{"input_ids": i, "labels": t, "attention_mask": a} for i, t, a in zip(
        input_ids.split(MICRO_BATCH_SIZE), labels.split(MICRO_BATCH_SIZE),
        attention_mask.split(MICRO_BATCH_SIZE))]
    return [batches[rank * num_micro:(rank + 1) * num_micro] for rank in range(data_parallel)]


def adam_state_by_name(model: torch.nn.Module, optimizer: torch.optim.AdamW
                       ) -> dict[str, dict[str, torch.Tensor]]:
    """{"exp_avg": {param name: tensor}, "exp_avg_sq": {...}}: Adam's moments by name."""
    return {key: {name: optimizer.state[param][key] for name, param in model.named_parameters()}
            for key in ("exp_avg", "exp_avg_sq")}


def load_adam_state(model: torch.nn.Module, optimizer: torch.optim.AdamW,
                    moments: dict[str, dict[str, torch.Tensor]], step: int) -> None:
    for name, param in model.named_parameters():
        optimizer.state[param] = {"step": torch.tensor(float(step)),
                                  **{key: moments[key][name].clone() for key in moments}}


def train_single_process(data_parallel: int, num_micro: int, steps: int = STEPS,
                         build_model: ModelBuilder = tiny_model
                         ) -> tuple[list[float], dict, dict]:
    """(losses, state dict, Adam moments by name) after `steps` steps."""
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, eps=ADAM_EPS)
    losses = []
    for step in range(steps):
        micro = [mb for rank_batches in micro_batches_of(step, data_parallel, num_micro)
                 for mb in rank_batches]
        loss = torch.stack([model(mb["input_ids"], mb["labels"], mb["attention_mask"]).loss
                            for mb in micro]).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    return losses, state, adam_state_by_name(model, optimizer)


def train_on_grid(world_size: int, tensor_parallel: int, pipeline_parallel: int,
                  sequence_parallel: bool, schedule: str, num_micro: int,
                  steps: range = range(STEPS), resume_from: tuple[dict, dict] | None = None,
                  build_model: ModelBuilder = tiny_model, context_parallel: int = 1,
                  ) -> tuple[list[float], dict | None, dict | None]:
    """Run inside a rank: (losses, whole-model state dict and Adam moments by name on rank 0,
    else None, None). `resume_from`: a whole-model (state dict, moments) saved after step
    `steps.start - 1`, loaded through the layout-neutral checkpoint functions. The C ranks of
    a context-parallel group read the same micro-batches, each computes its share of them."""
    dims = ParallelDims(world_size, tensor_parallel, pipeline_parallel,
                        context_parallel).build_groups()
    model = build_model()
    split_into_stage(model, dims)
    if tensor_parallel > 1:
        parallelize_model(model, dims, sequence_parallel)
    if context_parallel > 1:
        model.use_sequence_shard(ContextShard.of(dims.cp_group))
    if resume_from is not None:
        full_state, full_moments = resume_from
        model.load_state_dict(shard_full_tensors(full_state, list(model.state_dict()),
                                                 layouts_of(model.config), dims))
    ddp = None
    if dims.data_parallel * context_parallel > 1:  # our DDP, averaging over dp x cp only
        ddp = DistributedDataParallel(model, DistributedDataParallelConfig(
            bucket_size=None, overlap_grad_reduce=False), process_group=dims.dp_cp_group)
    pipeline = PipelineSchedule(llama_stage(model, dims), dims, schedule, sequence_parallel,
                                grad_sync=ddp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, eps=ADAM_EPS)
    if resume_from is not None:
        names = [name for name, _ in model.named_parameters()]
        load_adam_state(model, optimizer, {
            key: shard_full_tensors(by_name, names, layouts_of(model.config), dims)
            for key, by_name in full_moments.items()}, step=steps.start)
    losses = []
    for step in steps:
        loss = pipeline.step(micro_batches_of(step, dims.data_parallel, num_micro)[dims.dp_rank])
        if ddp is not None:
            ddp.finish_grad_sync()
            for param in model.parameters():
                param.grad = param.main_grad
            torch.distributed.all_reduce(loss, group=dims.dp_group)  # (whole on cp ranks)
            loss /= dims.data_parallel
        optimizer.step()
        optimizer.zero_grad()
        if ddp is not None:
            ddp.zero_grad_buffer()
        losses.append(loss.item())
    moments = {key: gather_full_tensors(by_name, layouts_of(model.config), dims)
               for key, by_name in adam_state_by_name(model, optimizer).items()}
    state = gather_full_tensors(model.state_dict(), layouts_of(model.config), dims)
    return losses, state, (moments if state is not None else None)


def train_grids(rank: int, world_size: int, grids: dict[str, tuple],
                build_model: ModelBuilder = tiny_model) -> dict:
    """Inside a rank, train each grid (a `Grid`'s fields) from `build_model()`. Per grid:
    (losses, whole state as numpy arrays on rank 0: they pickle by value, torch tensors would
    travel as shared-memory handles that die with this process)."""
    results = {}
    for name, row in grids.items():
        grid = Grid(*row)
        losses, state, _ = train_on_grid(*grid[:6], build_model=build_model,
                                         context_parallel=grid.context_parallel)
        results[name] = (losses, state and {key: t.numpy() for key, t in state.items()})
    return results


def assert_grids_equal_single_process(results: list[dict], grids: dict[str, tuple],
                                      build_model: ModelBuilder = tiny_model) -> None:
    """`train_grids`' per-rank results equal one process training the same global batches:
    the loss of every step on every rank, and every weight after the last step."""
    for name, row in grids.items():
        grid = Grid(*row)
        ref_losses, ref_state, _ = train_single_process(grid.data_parallel, grid.micro_batches,
                                                        build_model=build_model)
        for rank in range(grid.world):  # every rank reports the same (global) loss
            torch.testing.assert_close(results[rank][name][0], ref_losses, rtol=1e-5, atol=1e-6,
                                       msg=f"{name}: losses differ on rank {rank}")
        state = {key: torch.from_numpy(a) for key, a in results[0][name][1].items()}
        assert set(state) == set(ref_state), name
        # A wrong or missing gradient moves weights by about LR = 1e-2 (see ADAM_EPS).
        for key, value in ref_state.items():
            torch.testing.assert_close(state[key], value, rtol=1e-4, atol=1e-5,
                                       msg=f"{name}: {key} differs after {STEPS} steps")
