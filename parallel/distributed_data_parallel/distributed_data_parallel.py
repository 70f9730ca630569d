"""Our DistributedDataParallel: every rank holds the whole model, ranks average their gradients.

One training step on W ranks, each with its own micro-batches:

    forward / backward on the local micro-batch   (gradients differ per rank)
    average gradients over ranks                  (this file + a comm hook)
    optimizer step                                (identical on every rank -> replicas stay equal)

The averaging overlaps backward. Gradients live in contiguous buckets (param_and_grad_buffer.py,
reverse registration order); a per-parameter hook adds each gradient into its bucket as soon as
autograd has it, and when a bucket's last gradient arrives its collective starts
asynchronously while backward goes on computing the earlier layers. `finish_grad_sync()` waits
for all of them. Buckets are always launched in the same order on every rank (bucket k only
after buckets 0..k-1): collectives are matched by order, so two ranks that launched different
buckets first would reduce unrelated tensors or deadlock.

Gradient accumulation: inside `no_sync()` gradients only accumulate into the buffer; the
backward of the last micro-batch (outside `no_sync()`) launches the reductions.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import Parameter

from parallel.replica_start import broadcast_from_first_rank

from .ddp_comm_hooks.default_hooks import (
    CommHook,
    Waitable,
    allreduce_hook,
    allreduce_wire_bytes,
    reduce_scatter_hook,
)
from .distributed_data_parallel_config import DistributedDataParallelConfig
from .param_and_grad_buffer import Bucket, ParamAndGradBuffer

logger = logging.getLogger(__name__)


class DistributedDataParallel(nn.Module):
    """Wrap `module` so that, after `finish_grad_sync()`, every `param.main_grad` holds the
    gradient averaged over the ranks of `process_group` (default: all ranks); with
    `use_distributed_optimizer` (reduce-scatter) only inside this rank's shard of each bucket.
    Parameters keep `param.grad = None`: optimizers read `param.main_grad`.

    `.param_and_grad_buffers` is the list of ParamAndGradBuffer (one per parameter dtype);
    Megatron-LM calls it `buffers`, which would shadow `nn.Module.buffers()` here.
    """

    def __init__(self, module: nn.Module, config: DistributedDataParallelConfig,
                 process_group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.module = module
        self.config = config
        self.process_group = process_group
        self.data_parallel_world_size = dist.get_world_size(process_group)
        self.data_parallel_rank = dist.get_rank(process_group)
        self.param_names = {param: name for name, param in module.named_parameters()}
        broadcast_from_first_rank(module, process_group)  # identical replicas

        params = [param for param in module.parameters() if param.requires_grad]
        if not params:
            raise ValueError("DistributedDataParallel: the module has no trainable parameters")
        self.param_and_grad_buffers = self._build_buffers(params)
        # Launch order: buffer by buffer, each in its reverse-registration bucket order.
        self._buckets: list[Bucket] = [bucket for buffer in self.param_and_grad_buffers
                                       for bucket in buffer.buckets]
        for global_index, bucket in enumerate(self._buckets):
            bucket.global_index = global_index
        self._buckets[-1].is_last = True
        self._bucket_of_param = {param: bucket for bucket in self._buckets
                                 for param in bucket.params}
        if self.data_parallel_rank == 0:
            names = self.param_names
            logger.debug("\n".join(buffer.describe(names)
                                   for buffer in self.param_and_grad_buffers))

        # ZeRO-1 only needs this rank's shard reduced, so it gets reduce-scatter by default.
        self._comm_hook: CommHook = (reduce_scatter_hook if config.use_distributed_optimizer
                                     else allreduce_hook)
        self._comm_state: Any = process_group

        # Per-step bookkeeping, reset by _reset_step_state().
        self._is_last_microbatch = True
        self._ready_params: list[set[Parameter]] = [set() for _ in self._buckets]
        self._next_bucket_to_launch = 0
        self._in_flight: list[tuple[Bucket, Waitable]] = []
        self._params_with_grad: set[Parameter] = set()
        self._bytes_this_step = 0
        self.comm_bytes_last_step = 0
        """Bytes this rank sent to reduce the last step's gradients (see default_hooks)."""

        for param in params:
            param.register_post_accumulate_grad_hook(self._on_grad_ready)

    # ---- setup ---------------------------------------------------------------------------

    def _build_buffers(self, params: list[Parameter]) -> list[ParamAndGradBuffer]:
        """One buffer per parameter dtype, parameters kept in registration order."""
        params_by_dtype: dict[torch.dtype, list[Parameter]] = {}
        for param in params:
            params_by_dtype.setdefault(param.dtype, []).append(param)
        return [ParamAndGradBuffer(
                    dtype_params, param_dtype=dtype,
                    grad_dtype=torch.float32 if self.config.grad_reduce_in_fp32 else dtype,
                    bucket_size=self.config.bucket_size,
                    data_parallel_world_size=self.data_parallel_world_size,
                    use_distributed_optimizer=self.config.use_distributed_optimizer)
                for dtype, dtype_params in params_by_dtype.items()]

    def register_comm_hook(self, state: Any, hook: CommHook) -> None:
        """Replace how buckets are reduced: `hook(state, bucket)` returns something with
        `wait()` (see ddp_comm_hooks/default_hooks.py). Register before the first backward."""
        if self._in_flight:
            raise RuntimeError("register_comm_hook() while gradients are being reduced")
        self._comm_state, self._comm_hook = state, hook

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    # ---- during backward -----------------------------------------------------------------

    def _on_grad_ready(self, param: Parameter) -> None:
        """Autograd calls this once `param.grad` holds this backward's gradient for `param`."""
        bucket = self._bucket_of_param[param]
        if bucket.global_index < self._next_bucket_to_launch:
            # Adding now would race with (or come after) the bucket's collective.
            raise RuntimeError(
                f"gradient of {self.param_names.get(param, '?')} arrived after its bucket's "
                f"reduction started: a second backward in one step needs no_sync() around "
                f"every backward but the last (gradient accumulation), or "
                f"finish_grad_sync() and zero_grad_buffer() in between.")
        param.main_grad.add_(param.grad)
        param.grad = None  # the buffer holds the gradient now; free autograd's copy at once
        self._params_with_grad.add(param)
        if self.config.overlap_grad_reduce and self._is_last_microbatch:
            ready = self._ready_params[bucket.global_index]
            ready.add(param)
            if len(ready) == len(bucket.params):
                self._launch_ready_buckets()

    def _launch_ready_buckets(self) -> None:
        """Launch buckets in order, as far as they are complete (same order on every rank)."""
        while self._next_bucket_to_launch < len(self._buckets):
            bucket = self._buckets[self._next_bucket_to_launch]
            if len(self._ready_params[bucket.global_index]) < len(bucket.params):
                return
            self._launch(bucket)

    def _launch(self, bucket: Bucket) -> None:
        handle = self._comm_hook(self._comm_state, bucket)
        self._in_flight.append((bucket, handle))
        # A hook that returns a bare Work is counted as a plain all-reduce of the bucket.
        default_bytes = allreduce_wire_bytes(bucket.grad_data, self.data_parallel_world_size)
        self._bytes_this_step += getattr(handle, "bytes_sent", default_bytes)
        self._next_bucket_to_launch += 1

    # ---- after backward ------------------------------------------------------------------

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients without communicating (all micro-batches but the last)."""
        self._is_last_microbatch = False
        try:
            yield
        finally:
            self._is_last_microbatch = True

    @contextlib.contextmanager
    def gathered_params(self) -> Iterator[None]:
        """Every parameter whole inside the block: always so with DDP (ZeRO-3's wrapper
        gathers its shards here; parallel/gradient_sync.py)."""
        yield

    def accumulated_grad(self, param: Parameter) -> torch.Tensor:
        """`param.main_grad`: this rank's sum over the micro-batches until finish_grad_sync
        reduces it (parallel/gradient_sync.py)."""
        return param.main_grad

    def finish_grad_sync(self) -> None:
        """Launch what backward did not launch, and wait until every bucket is reduced."""
        some_unused = len(self._params_with_grad) < len(self._bucket_of_param)
        if some_unused and not self.config.allow_unused_params:  # (name them: the slow path)
            unused = [param for param in self._bucket_of_param
                      if param not in self._params_with_grad]
            names = ", ".join(self.param_names.get(p, "?") for p in unused)
            self._reset_step_state()
            raise RuntimeError(
                f"these parameters received no gradient in this step: {names}. Make the loss "
                f"depend on them, set requires_grad=False, or pass allow_unused_params=True "
                f"to DistributedDataParallelConfig (their gradient then counts as zero).")
        # With overlap off this launches everything; with overlap on, only buckets that hold a
        # parameter without gradient (allow_unused_params) or that backward never completed.
        while self._next_bucket_to_launch < len(self._buckets):
            self._launch(self._buckets[self._next_bucket_to_launch])
        try:
            for bucket, handle in self._in_flight:
                try:
                    handle.wait()
                except RuntimeError as error:
                    names = ", ".join(self.param_names.get(p, "?") for p in bucket.params[:3])
                    # The hook's own work (e.g. OverlappedAdamW's step) also runs in wait():
                    # keep its message, and blame other ranks only for communication errors.
                    raise RuntimeError(
                        f"rank {self.data_parallel_rank}: reducing gradient bucket "
                        f"{bucket.global_index} ({names}, ...) failed: {error}\nIf this is a "
                        f"communication error, another rank probably crashed, diverged or "
                        f"timed out: look at its log first.") from error
            self.comm_bytes_last_step = self._bytes_this_step
        finally:
            self._reset_step_state()

    def zero_grad_buffer(self) -> None:
        """Zero all gradient buffers (start of a step) and forget any half-done step."""
        for buffer in self.param_and_grad_buffers:
            buffer.grad_data.zero_()
        self._reset_step_state()

    def _reset_step_state(self) -> None:
        for ready in self._ready_params:
            ready.clear()
        self._params_with_grad.clear()
        self._in_flight = []
        self._next_bucket_to_launch = 0
        self._bytes_this_step = 0
