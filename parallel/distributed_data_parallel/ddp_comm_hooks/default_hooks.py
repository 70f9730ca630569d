"""The standard ways to reduce a bucket: all-reduce, reduce-scatter, and low-precision wrappers.

A comm hook is `hook(state, bucket) -> handle`. It starts the bucket's communication
(asynchronously) and returns a handle; `finish_grad_sync()` calls `handle.wait()`, after which
`bucket.grad_data` must hold the average over ranks (reduce-scatter: inside this rank's shard).
Hooks here return a `CommHandle`, which also says how many bytes the hook sent, so DDP can report
`comm_bytes_last_step` whichever hook runs.

Where the average happens: every hook divides its local tensor by the world size W *before*
summing (as PyTorch's DDP does). The sum then never exceeds W x the largest local value, which
matters in fp16/bf16, and SUM is the one reduction every backend (gloo, nccl, mpi) offers.
For W a power of two the division is exact, so this equals "sum, then divide" bit for bit.

Backends: gloo (CPU) and nccl (CUDA) both provide every collective used here in torch 2.13
(all-reduce SUM in fp32/bf16/fp16, reduce_scatter_single, broadcast, async handles), so no hook
has a backend-specific path; a hook that needed one would branch on dist.get_backend() here.

Bytes sent are counted per rank as a bandwidth-optimal (ring) implementation puts them on the
wire: all-reduce 2(W-1)/W x the tensor, reduce-scatter (W-1)/W x the tensor (the "bus
bandwidth" factors of nccl-tests' PERFORMANCE.md; Patarasuk & Yuan, 2009).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from parallel.flat_collectives import reduce_scatter_single

from ..param_and_grad_buffer import Bucket


class Waitable(Protocol):
    def wait(self) -> Any: ...


class CommHandle:
    """In-flight work of one hook: `wait()` waits for it, then runs `on_complete` (if any),
    once: a second `wait()` returns at once. `is_completed()` asks without blocking (torch's
    Work objects answer it on gloo and nccl alike)."""

    def __init__(self, works: Sequence[Waitable], bytes_sent: int,
                 on_complete: Callable[[], None] | None = None) -> None:
        self.works = list(works)
        self.bytes_sent = bytes_sent
        self.on_complete = on_complete
        self._done = False

    def is_completed(self) -> bool:
        return self._done or all(getattr(work, "is_completed", lambda: False)()
                                 for work in self.works)

    def wait(self) -> None:
        if self._done:
            return
        for work in self.works:
            work.wait()
        self._done = True
        if self.on_complete is not None:
            self.on_complete()


CommHook = Callable[[Any, Bucket], Waitable]


def allreduce_wire_bytes(tensor: Tensor, world_size: int) -> int:
    """Bytes one rank sends in a ring all-reduce of `tensor` (reduce-scatter + all-gather)."""
    return 2 * (world_size - 1) * tensor.numel() * tensor.element_size() // world_size


def reduce_scatter_wire_bytes(tensor: Tensor, world_size: int) -> int:
    """Bytes one rank sends in a ring reduce-scatter of `tensor`."""
    return (world_size - 1) * tensor.numel() * tensor.element_size() // world_size


def allreduce_average_async(tensor: Tensor, process_group: dist.ProcessGroup | None) -> Any:
    """Start turning `tensor` into its average over ranks, in place; returns the async Work."""
    tensor.div_(dist.get_world_size(process_group))
    return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=process_group, async_op=True)


def allreduce_hook(process_group: dist.ProcessGroup | None, bucket: Bucket) -> CommHandle:
    """Plain DDP: every rank ends with the average of the whole bucket."""
    world_size = dist.get_world_size(process_group)
    work = allreduce_average_async(bucket.grad_data, process_group)
    return CommHandle([work], allreduce_wire_bytes(bucket.grad_data, world_size))


def reduce_scatter_hook(process_group: dist.ProcessGroup | None, bucket: Bucket) -> CommHandle:
    """ZeRO-1: rank r ends with the average of its shard `grad_data.view(W, -1)[r]` only.

    Half the bytes of an all-reduce: each rank updates just its shard of the parameters and the
    distributed optimizer all-gathers the updated parameters afterwards. The output is a view
    of the input (the rank's own shard), which both gloo and nccl accept.
    """
    world_size = dist.get_world_size(process_group)
    rank = dist.get_rank(process_group)
    bucket.grad_data.div_(world_size)
    shard = bucket.grad_data.view(world_size, -1)[rank]
    work = reduce_scatter_single(shard, bucket.grad_data, op=dist.ReduceOp.SUM,
                                      group=process_group, async_op=True)
    return CommHandle([work], reduce_scatter_wire_bytes(bucket.grad_data, world_size))


def low_precision_wrapper(hook: CommHook, dtype: torch.dtype) -> CommHook:
    """Run `hook` on a `dtype` copy of the bucket: half the bytes of fp32, then copy back.

    The sum over ranks happens in `dtype` (bf16 keeps fp32's range with 8 mantissa bits; fp16
    has 11 bits but overflows above 65504 and flushes tiny gradients to zero); the result is
    written back into the fp32 buffer, where micro-batch accumulation and the optimizer work.
    Written by hand because PyTorch's bf16_compress_hook refuses gloo.
    """

    def compressed_hook(state: Any, bucket: Bucket) -> CommHandle:
        compressed = bucket.grad_data.to(dtype)
        inner = hook(state, dataclasses.replace(bucket, grad_data=compressed))
        return CommHandle([inner], getattr(inner, "bytes_sent", 0),
                          on_complete=lambda: bucket.grad_data.copy_(compressed))

    compressed_hook.__name__ = f"{dtype}_compressed_{getattr(hook, '__name__', 'hook')}"
    return compressed_hook


def bf16_compress_wrapper(hook: CommHook) -> CommHook:
    """`hook`, communicating in bfloat16."""
    return low_precision_wrapper(hook, torch.bfloat16)


def fp16_compress_wrapper(hook: CommHook) -> CommHook:
    """`hook`, communicating in float16."""
    return low_precision_wrapper(hook, torch.float16)


bf16_compress_hook = bf16_compress_wrapper(allreduce_hook)
fp16_compress_hook = fp16_compress_wrapper(allreduce_hook)
