"""ZeRO stages 2 and 3 (Rajbhandari et al., "ZeRO", 2020): shard gradients, then parameters.

ZeRO-1 (optimizer/distributed_optimizer/) shards the optimizer state but keeps on every rank
the whole model and its whole gradient. This wrapper shards those too, one *unit* at a time
(flat_param_unit.py): a unit per submodule the caller's `is_unit` names (for our llama each
decoder block: parallel_plan/llama_units.py) plus a root unit for everything else
(embeddings, final norm, lm_head; a tied lm_head is the embedding Parameter, so it is in the
root unit once).

Stage 2, gradients sharded. Every rank keeps the whole model. When a unit's last gradient of a
backward arrives, its full gradient (allocated for that moment only) is reduce-scattered and
rank r adds the average of its shard into its persistent `grad_shard`. After the optimizer has
updated the shard, each unit's shards are all-gathered back into the full parameters.

Reduce-scatters in flight are bounded. A reduce-scatter is started asynchronously, so that it
overlaps the backward of the next units, and the unit's full gradient must live until it has
finished. Waiting for all of them only at the end of backward would keep every unit's full
gradient alive at once: the whole model's gradient, the memory stage 2 exists to remove. So
when a new reduce-scatter starts and more than `max_reductions_in_flight` (default 1) are
pending, the oldest is waited for, added into its shard and its full gradient freed. With 1,
block k's reduce-scatter overlaps the backward of block k - 1 and is waited for when block
k - 1's own starts (torch FSDP2's `reduce_scatter_max_input_buffers`, default 1, is the same
bound). Full gradients alive during backward, at most: the in-flight ones, the block whose
gradients are arriving, and the root unit, whose final-norm gradient arrives first and whose
embedding gradient arrives last. Each unit's shard receives the same sum whenever it is waited
for, so results do not depend on the bound.

Stage 3, parameters sharded (what FSDP does). A unit's parameters exist whole only while it
computes:
    forward   pre-hook: all-gather this unit (waiting for the prefetch), start gathering the
              next block's; post-hook: free it again, and hook its output so that ...
    backward  ... when the gradient reaches the block's output, the unit is gathered again
              (the previous block's gather prefetched); once all its gradients have arrived it
              is freed and its gradient reduce-scattered into the shard.
The root unit is gathered on first use and stays gathered until the end of backward (its
embedding is needed at the very start of forward and the very end of backward). Activation
checkpointing re-runs a block's forward inside backward: the post-forward hook then leaves the
unit gathered, since its backward comes right after. KV-cache generation runs no backward: each
block is gathered and freed per forward; the root unit stays gathered until `reshard()` (the
next backward or optimizer step calls it).

Gradient accumulation: every micro-batch's backward reduce-scatters into the shard, also
inside `no_sync()`. Accumulating whole gradients and reducing once would need a full-size
gradient per rank during all micro-batches, which is exactly the memory stage 2 removes
(DeepSpeed's stage 2 and FSDP's default make the same choice). The price is one reduce-scatter
per micro-batch instead of one per step. `no_sync()` keeps the meaning it has for our DDP,
"more backwards of this step follow" (the same `GradientSync` protocol,
parallel/gradient_sync.py): inside it the root unit stays gathered at the end of a backward.
A pipeline runs several forwards before their backwards (afab: all of them), and the last
stage's final norm needs its weight in every one of those backwards; the blocks are gathered
again by their own pre-backward hooks.

Pipeline stages: the wrapper wraps one stage's module over the data-parallel group; its units
are the stage's blocks, plus (`with_owner_of`) the tied embedding's copy alone in a unit,
so that its gradient shard is the same elements on the first and the last stage.
`accumulated_grad(param)` hands that shard to the schedule, which sums it over both stages.

Memory per rank, worked example: a 1B-parameter bf16 model (P = 1e9), W = 8, AdamW with fp32
master weights (4 + 4 + 4 = 12 bytes per parameter of state):
    stage 0: params 2P + grads 4P (fp32 reduction) + state 12P          = 18 GB
    stage 1: 2P + 4P + 12P/8                                            = 7.5 GB
    stage 2: 2P + 4P/8 + 12P/8 (+ 3 units' full gradients)              = 4 GB
    stage 3: 2P/8 + 4P/8 + 12P/8 (+ 3 units' full params and grads)     = 2.25 GB
(3 units in backward: the root, the block computing, and the block reducing (grads) or being
prefetched (params); at most `max_reductions_in_flight` blocks reduce at once, see above.)
(`parallel_plan/memory_plan.py` computes these for a given model and prints the formulas.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable
from torch.nn import Parameter

from parallel.replica_start import broadcast_from_first_rank

from .flat_param_unit import FlatParamUnit


def with_owner_of(is_unit: Callable[[nn.Module], bool], param: Parameter | None
                  ) -> Callable[[nn.Module], bool]:
    """Unit boundaries: those of `is_unit`, and the module that owns `param` (None: `is_unit`
    alone). A pipeline's tied embedding is two Parameters on two stages (the first stage's
    embedding, the last stage's head) whose gradients are summed: alone in a unit, each is cut
    into the same shards on both stages, so the two shards can be summed
    (parallel/pipeline_parallel/stage.py)."""
    def is_unit_or_owner(module: nn.Module) -> bool:
        return is_unit(module) or (
            param is not None and any(own is param for own in module.parameters(recurse=False)))
    return is_unit_or_owner


def group_into_units(module: nn.Module, is_unit: Callable[[nn.Module], bool]
                     ) -> tuple[list[tuple[nn.Module, list[Parameter]]], list[Parameter]]:
    """([(unit module, its trainable parameters)] in module order, the root unit's parameters:
    every other trainable one). A parameter shared by two units (tied) goes to the first. The
    one grouping the wrapper and the memory plan (parallel_plan/memory_plan.py) both use."""
    claimed: set[Parameter] = set()
    units = []
    for unit_module in module.modules():
        if unit_module is module or not is_unit(unit_module):
            continue
        params = [p for p in unit_module.parameters() if p.requires_grad and p not in claimed]
        if params:
            units.append((unit_module, params))
            claimed.update(params)
    root = [p for p in module.parameters() if p.requires_grad and p not in claimed]
    return units, root


class ShardedDataParallel(nn.Module):
    """Wrap `module` for ZeRO stage 2 or 3 over `process_group` (default: all ranks).

    The optimizer (optimizer/sharded_optimizer.py) reads and updates `unit.param_shard` with
    `unit.grad_shard` for every unit in `.units`, then calls `after_optimizer_step()`.
    `max_reductions_in_flight`: reduce-scatters left running before the oldest is waited for
    (module docstring): 1 keeps the least memory, more let communication overlap longer.
    """

    def __init__(self, module: nn.Module, zero_stage: int,
                 process_group: dist.ProcessGroup | None = None,
                 grad_reduce_in_fp32: bool = True,
                 *, is_unit: Callable[[nn.Module], bool],
                 max_reductions_in_flight: int = 1) -> None:
        super().__init__()
        if zero_stage not in (2, 3):
            raise ValueError(f"ShardedDataParallel does ZeRO stages 2 and 3, got {zero_stage}")
        if max_reductions_in_flight < 1:
            raise ValueError(f"max_reductions_in_flight must be at least 1, got "
                             f"{max_reductions_in_flight}")
        self.max_reductions_in_flight = max_reductions_in_flight
        self.module = module
        self.zero_stage = zero_stage
        self.process_group = process_group
        self.data_parallel_world_size = dist.get_world_size(process_group)
        self.data_parallel_rank = dist.get_rank(process_group)
        self.param_names = {param: name for name, param in module.named_parameters()}
        broadcast_from_first_rank(module, process_group)  # then each keeps its shard
        grad_dtype = torch.float32 if grad_reduce_in_fp32 else None

        # Step 1: one unit per matching submodule (in forward order), the rest is the root unit.
        unit_groups, root_params = group_into_units(module, is_unit)
        self._block_units: list[tuple[nn.Module, FlatParamUnit]] = [
            (unit_module, self._new_unit(params, grad_dtype))
            for unit_module, params in unit_groups]
        self.root_unit = self._new_unit(root_params, grad_dtype) if root_params else None
        # Root first: in forward it is used first (embeddings), in backward it finishes last.
        self.units: list[FlatParamUnit] = (([self.root_unit] if self.root_unit else [])
                                           + [unit for _, unit in self._block_units])
        self._unit_of_param = {param: (unit, index) for unit in self.units
                               for index, param in enumerate(unit.params)}

        # Step 2: hooks. Gradients on every parameter; gather/free around blocks (stage 3).
        for param in self._unit_of_param:
            param.register_post_accumulate_grad_hook(self._on_grad_ready)
        if zero_stage == 3:
            for position, (block, _) in enumerate(self._block_units):
                block.register_forward_pre_hook(self._make_pre_forward(position))
                block.register_forward_hook(self._make_post_forward(position))
            if self.root_unit is not None:
                self._register_root_gather(module)
        self._backward_callback_queued = False
        self._more_backwards_follow = False  # inside no_sync()
        self._pinned = False  # inside gathered_params(): no hook frees anything
        self._in_backward: set[FlatParamUnit] = set()
        self._reducing: list[FlatParamUnit] = []  # reduce-scatters in flight, oldest first
        self.comm_bytes_last_step = 0
        """Bytes this rank sent in the last step's gathers and reduce-scatters (as our DDP's)."""

    def _new_unit(self, params: list[Parameter], grad_dtype: torch.dtype | None
                  ) -> FlatParamUnit:
        names = [self.param_names[p] for p in params]
        return FlatParamUnit(names[0].rsplit(".", 1)[0], params, names, self.process_group,
                             keep_params_gathered=self.zero_stage == 2, grad_dtype=grad_dtype)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    # ---- stage 3: gather before compute, free after ---------------------------------------
    def _register_root_gather(self, module: nn.Module) -> None:
        """Every module that owns a root parameter gathers the root unit before its forward
        (generation calls the embedding and lm_head directly, not the model's forward)."""
        root_params = set(self.root_unit.params)
        for owner in module.modules():
            if any(p in root_params for p in owner.parameters(recurse=False)):
                owner.register_forward_pre_hook(lambda *_: self.root_unit.wait_gather())

    def _make_pre_forward(self, position: int):
        def gather_before_forward(block: nn.Module, args: Any) -> None:
            unit = self._block_units[position][1]
            unit.wait_gather()
            if unit not in self._in_backward and position + 1 < len(self._block_units):
                self._block_units[position + 1][1].start_gather()  # prefetch
        return gather_before_forward

    def _make_post_forward(self, position: int):
        def free_after_forward(block: nn.Module, args: Any, output: Any) -> None:
            unit = self._block_units[position][1]
            if unit in self._in_backward:
                return  # activation checkpointing's recompute: backward follows at once
            if not self._pinned:
                unit.free_params()
            if torch.is_grad_enabled() and isinstance(output, torch.Tensor) \
                    and output.requires_grad:
                output.register_hook(self._make_pre_backward(position))
        return free_after_forward

    def _make_pre_backward(self, position: int):
        def gather_before_backward(grad: torch.Tensor) -> None:
            unit = self._block_units[position][1]
            self._queue_backward_callback()
            self._in_backward.add(unit)
            unit.wait_gather()
            if position > 0:
                self._block_units[position - 1][1].start_gather()  # prefetch
        return gather_before_backward

    # ---- gradients ---------------------------------------------------------------------------
    def _on_grad_ready(self, param: Parameter) -> None:
        """Autograd calls this once `param.grad` holds this backward's gradient."""
        self._queue_backward_callback()
        unit, index = self._unit_of_param[param]
        if unit.add_grad(param, index):
            if unit is not self.root_unit and not self._pinned:
                unit.free_params()  # stage 3: its backward is done
            unit.start_reduce()
            self._reducing.append(unit)
            while len(self._reducing) > self.max_reductions_in_flight:
                self._reducing.pop(0).finish_reduce()  # frees its full gradient

    def _queue_backward_callback(self) -> None:
        if not self._backward_callback_queued:
            self._backward_callback_queued = True
            Variable._execution_engine.queue_callback(self._end_of_backward)

    def _end_of_backward(self) -> None:
        """After every backward (every micro-batch): finish the reductions still in flight, free
        everything."""
        self._backward_callback_queued = False
        incomplete = [unit for unit in self.units
                      if unit.params_with_grad and unit not in self._reducing]
        if incomplete:
            missing = [name for unit in incomplete for p, name in
                       zip(unit.params, unit.param_names) if p not in unit.params_with_grad]
            raise RuntimeError(f"these parameters received no gradient in this backward: "
                               f"{', '.join(missing)}; ZeRO-2/3 need every parameter to be used")
        for unit in self._reducing:
            unit.finish_reduce()
        self._reducing = []
        self._in_backward.clear()
        if not self._pinned:
            self.reshard(keep_root=self._more_backwards_follow)

    def reshard(self, keep_root: bool = False) -> None:
        """Stage 3: free every gathered unit, or all but the root (a no-op at stage 2, whose
        params stay whole)."""
        for unit in self.units:
            if not (keep_root and unit is self.root_unit):
                unit.free_params()

    # ---- the interface the training loop uses (same as our DDP: GradientSync) ---------------
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backwards inside this block are not the step's last: sharded gradients are still
        reduced every micro-batch (module docstring), but the root unit stays gathered."""
        self._more_backwards_follow = True
        try:
            yield
        finally:
            self._more_backwards_follow = False

    def accumulated_grad(self, param: Parameter) -> torch.Tensor:
        """This rank's shard of `param`'s gradient, averaged over the group and summed over the
        micro-batches so far. Only for a parameter alone in its unit (`with_owner_of`):
        elsewhere the shard also holds other parameters' elements."""
        unit, _ = self._unit_of_param[param]
        if len(unit.params) != 1:
            raise ValueError(f"{self.param_names[param]} shares its ZeRO unit with other "
                             "parameters: build the wrapper with is_unit=with_owner_of(is_unit, "
                             "param) to give it a unit of its own")
        return unit.grad_shard

    def finish_grad_sync(self) -> None:
        """Every reduction already finished at the end of backward; nothing is left to wait."""

    def zero_grad_buffer(self) -> None:
        for unit in self.units:
            unit.grad_shard.zero_()

    def after_optimizer_step(self) -> None:
        """Stage 2: all-gather the updated shards into the whole params (stage 3 keeps shards)."""
        if self.zero_stage == 2:
            for unit in self.units:
                unit.gather_after_step()
        self.reshard()  # stage 3: a root unit left gathered by a no-grad forward (generation)
        self.comm_bytes_last_step = sum(unit.bytes_sent for unit in self.units)
        for unit in self.units:
            unit.bytes_sent = 0

    @contextlib.contextmanager
    def gathered_params(self) -> Iterator[None]:
        """Every parameter whole, and kept whole, inside the block. All ranks must enter it (it
        all-gathers); inside, one rank alone may run forwards (sample generation on rank 0) or
        save the model, since no hook gathers or frees there."""
        for unit in self.units:
            unit.wait_gather()
        self._pinned = True
        try:
            yield
        finally:
            self._pinned = False
            self.reshard()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict as CPU copies, on every rank (collective)."""
        with self.gathered_params():
            return {name: tensor.detach().cpu().clone()
                    for name, tensor in self.module.state_dict().items()}

    def resident_bytes(self) -> dict[str, int]:
        """Parameter and gradient bytes this rank holds right now (all units)."""
        totals = {"params": 0, "grads": 0}
        for unit in self.units:
            for kind, count in unit.resident_bytes().items():
                totals[kind] += count
        return totals
