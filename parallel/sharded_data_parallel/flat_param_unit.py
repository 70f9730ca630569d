"""One unit of ZeRO-2/3: the parameters of one module laid out in a flat buffer, cut in W shards.

A *unit* is what one collective moves: for stage 3 the parameters of one decoder block (or the
"root" rest of the model: embeddings, final norm, lm_head). Its parameters are placed one after
another in a flat buffer padded to a multiple of the data-parallel world size W, exactly like a
DDP bucket (param_and_grad_buffer.py), and rank r owns elements [r * S, (r + 1) * S), S = padded
numel / W.

Worked example, W = 2, a unit with q (3 elements) and g (2 elements):

    flat index   0 1 2 | 3 4 5
    holds        q q q | g g pad
    owner        rank 0| rank 1        S = 3; rank 1's shard holds g[0:2] and one padding zero

What lives where (stage 3):
    param_shard   [S] in the params' dtype, always allocated: the only copy of this rank's part
    full_params   [W*S] whose storage is allocated only while the unit is gathered; every
                  parameter's `.data` is a view into it (so the views come back to life when the
                  storage is re-allocated and all-gathered into, the trick FSDP1 uses)
    grad_shard    [S] fp32, always allocated: this rank's part of the averaged gradient,
                  accumulated over micro-batches
    full_grads    [W*S] fp32, allocated only from the unit's first gradient of a backward until
                  its reduce-scatter has finished (the wrapper waits for it as soon as newer
                  units' reduce-scatters reach its bound: sharded_data_parallel.py)
Stage 2 uses the same unit with `keep_params_gathered=True`: `full_params` is never freed and
`param_shard` is a view of this rank's part of it (what the optimizer updates before the
all-gather), so only gradients (and optimizer state) are sharded.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn import Parameter

from parallel.distributed_data_parallel.param_and_grad_buffer import pad_to_multiple
from parallel.flat_collectives import all_gather_single, reduce_scatter_single


class FlatParamUnit:
    """The flat, sharded storage of one unit's parameters and gradients (module docstring)."""

    def __init__(self, name: str, params: list[Parameter], param_names: list[str],
                 process_group: dist.ProcessGroup | None, keep_params_gathered: bool,
                 grad_dtype: torch.dtype | None) -> None:
        self.name = name
        self.params = params
        self.param_names = param_names
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.keep_params_gathered = keep_params_gathered
        dtype, device = params[0].dtype, params[0].device
        self.grad_dtype = grad_dtype or dtype
        # Step 1: the layout, parameters in registration order.
        self.ranges: list[tuple[int, int]] = []
        next_free = 0
        for param in params:
            self.ranges.append((next_free, next_free + param.numel()))
            next_free += param.numel()
        self.numel = pad_to_multiple(next_free, self.world_size)
        self.shard_size = self.numel // self.world_size
        self.shard_start = self.rank * self.shard_size
        # Step 2: move the parameters into the full buffer, keep this rank's shard.
        self.full_params = torch.zeros(self.numel, dtype=dtype, device=device)
        with torch.no_grad():
            for param, (start, end) in zip(params, self.ranges):
                self.full_params[start:end].copy_(param.detach().view(-1))
                param.data = self.full_params[start:end].view(param.shape)
        own = self.full_params[self.shard_start:self.shard_start + self.shard_size]
        self.param_shard = own if keep_params_gathered else own.clone()
        self.grad_shard = torch.zeros(self.shard_size, dtype=self.grad_dtype, device=device)
        self.full_grads: Tensor | None = None
        self.is_gathered = True
        self._gather_work: Any = None
        self._reduce: tuple[Any, Tensor] | None = None  # (work, reduced shard) in flight
        self.params_with_grad: set[Parameter] = set()
        self.bytes_sent = 0
        """By this rank's collectives since the wrapper last read it: a ring all-gather or
        reduce-scatter sends (W - 1) shards."""
        if not keep_params_gathered:
            self.free_params()

    # ---- parameters: gather before use, free after ---------------------------------------
    def start_gather(self) -> None:
        """Re-allocate the full buffer and start all-gathering the shards into it (async)."""
        if self.is_gathered or self._gather_work is not None:
            return
        self.full_params.untyped_storage().resize_(self.numel * self.full_params.element_size())
        self._count_sent(self.param_shard)
        self._gather_work = all_gather_single(self.full_params, self.param_shard,
                                                   group=self.process_group, async_op=True)

    def wait_gather(self) -> None:
        """Make the parameters usable: start the gather if nobody prefetched it, wait for it."""
        self.start_gather()
        if self._gather_work is not None:
            self._gather_work.wait()
            self._gather_work = None
        self.is_gathered = True

    def free_params(self) -> None:
        """Give the full buffer's memory back; the parameters' views stay, pointing at nothing."""
        if self._gather_work is not None:  # a prefetch nobody used: let it land first
            self.wait_gather()
        if self.keep_params_gathered or not self.is_gathered:
            return
        self.full_params.untyped_storage().resize_(0)
        self.is_gathered = False

    def gather_after_step(self) -> None:
        """Stage 2: every rank updated its shard of the full buffer in place; share them."""
        self._count_sent(self.param_shard)
        all_gather_single(self.full_params, self.param_shard, group=self.process_group)

    # ---- gradients: collect per micro-batch, reduce-scatter into the shard ------------------
    def add_grad(self, param: Parameter, index: int) -> bool:
        """Move autograd's gradient of `param` into the full grad buffer. True when the unit has
        all its gradients of this backward (then it is time to reduce)."""
        if self.full_grads is None:
            self.full_grads = torch.zeros(self.numel, dtype=self.grad_dtype,
                                          device=self.grad_shard.device)
        start, end = self.ranges[index]
        self.full_grads[start:end].add_(param.grad.view(-1))
        param.grad = None  # the flat buffer holds it now
        self.params_with_grad.add(param)
        return len(self.params_with_grad) == len(self.params)

    def start_reduce(self) -> None:
        """Average the full gradient over ranks, this rank receiving only its shard (async)."""
        assert self.full_grads is not None
        self.full_grads.div_(self.world_size)
        reduced = torch.empty_like(self.grad_shard)
        self._count_sent(reduced)
        work = reduce_scatter_single(reduced, self.full_grads, op=dist.ReduceOp.SUM,
                                          group=self.process_group, async_op=True)
        self._reduce = (work, reduced)

    @property
    def is_reducing(self) -> bool:
        """A reduce-scatter was started and not yet waited for: `full_grads` is still alive."""
        return self._reduce is not None

    def finish_reduce(self) -> None:
        """Wait for the reduce-scatter, add it into the shard, drop the full gradient."""
        if self._reduce is not None:
            work, reduced = self._reduce
            work.wait()
            self.grad_shard.add_(reduced)
        self._reduce = None
        self.full_grads = None
        self.params_with_grad.clear()

    # ---- accounting ---------------------------------------------------------------------------
    def _count_sent(self, shard: Tensor) -> None:
        self.bytes_sent += (self.world_size - 1) * shard.numel() * shard.element_size()

    def resident_bytes(self) -> dict[str, int]:
        """Bytes this unit holds right now, by kind (tests and bench)."""
        full = self.full_params.untyped_storage().nbytes()
        own = 0 if self.keep_params_gathered else self.param_shard.numel() * \
            self.param_shard.element_size()
        grads = self.grad_shard.numel() * self.grad_shard.element_size()
        if self.full_grads is not None:
            grads += self.full_grads.numel() * self.full_grads.element_size()
        return {"params": full + own, "grads": grads}
