"""The memory behind our DDP: one contiguous gradient buffer per dtype, cut into buckets.

Why one flat buffer instead of a `.grad` per parameter:
- one collective over a few large tensors is far cheaper than one per parameter (each
  collective pays a fixed latency, and small messages never reach full bandwidth);
- nothing is copied into a separate communication buffer and back: every parameter's
  `param.main_grad` is a *view* into the buffer, so the optimizer reads the reduced gradient in
  place;
- ZeRO-1 shards optimizer state by plain slicing of the same buffer (`param_data` holds the
  parameters the same way when `use_distributed_optimizer` is on).

Layout, worked example. Parameters registered in the order a (3 elements), b (4), c (5);
`bucket_size=6`; data-parallel world size W=2. Parameters are placed in *reverse* order of
registration, because backward produces the last layers' gradients first: the first bucket is
then complete early in backward and its collective overlaps the rest of backward.

    c goes first:  [0, 5)    bucket 0 holds 5 < 6 elements, keep filling
    b:             [5, 9)    bucket 0 holds 9 >= 6: close it, pad 9 -> 10 (divisible by W)
    a:             [10, 13)  last parameter: close bucket 1, pad 13 -> 14

    index   0 1 2 3 4 | 5 6 7 8 | 9   | 10 11 12 | 13
    holds   c c c c c | b b b b | pad | a  a  a  | pad
    bucket  0 ......................... | 1 ............

    param_index_map = {c: (0, 5, 0), b: (5, 9, 0), a: (10, 13, 1)}   # (start, end, bucket)
    rank r's shard of a bucket = bucket.grad_data.view(W, -1)[r]:
        bucket 0: rank 0 owns [0, 5), rank 1 owns [5, 10);  bucket 1: [10, 12) and [12, 14)

A parameter is never split across buckets, so a bucket smaller than one parameter simply
holds that one parameter. Padding elements are zero and stay zero (they receive no gradient).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.nn import Parameter


def pad_to_multiple(numel: int, multiple: int) -> int:
    """The smallest size >= `numel` that `multiple` ranks can split evenly."""
    return math.ceil(numel / multiple) * multiple


@dataclass(eq=False)
class Bucket:
    """A contiguous slice of a buffer whose gradients are reduced by one collective.

    `params` are in buffer order (reverse registration); `param_ranges[i]` is where
    `params[i]` lies inside `grad_data` (bucket-relative start, end). Comm hooks only see
    buckets, so they get per-parameter views from `grad_views()`, never from `param.main_grad`
    (a compression wrapper may hand a hook a low-precision copy of `grad_data`).
    """

    index: int
    """Position of the bucket within its buffer."""
    params: list[Parameter]
    param_ranges: list[tuple[int, int]]
    offset: int
    """Start of the bucket inside its buffer."""
    grad_data: Tensor
    param_data: Tensor | None
    global_index: int = -1
    """Position in DDP's launch order over all buffers (set by DistributedDataParallel)."""
    is_last: bool = field(default=False)
    """True for the bucket launched last in every step (set by DistributedDataParallel)."""

    def grad_views(self) -> list[Tensor]:
        """Each parameter's gradient as a view into `grad_data`, shaped like the parameter."""
        return [self.grad_data[start:end].view(param.shape)
                for param, (start, end) in zip(self.params, self.param_ranges)]


def plan_layout(params: list[Parameter], bucket_size: int | None, world_size: int,
                ) -> tuple[dict[Parameter, tuple[int, int, int]], list[tuple[int, int]]]:
    """Place `params` (in registration order) into padded buckets, as in the module docstring.

    Returns `param_index_map` (param -> (start, end, bucket index)) and the buckets'
    (start, padded end) ranges.
    """
    param_index_map: dict[Parameter, tuple[int, int, int]] = {}
    bucket_ranges: list[tuple[int, int]] = []
    bucket_start = next_free = 0
    for position, param in enumerate(reversed(params)):
        param_index_map[param] = (next_free, next_free + param.numel(), len(bucket_ranges))
        next_free += param.numel()
        is_last_param = position == len(params) - 1
        bucket_is_full = bucket_size is not None and next_free - bucket_start >= bucket_size
        if bucket_is_full or is_last_param:
            bucket_end = pad_to_multiple(next_free, world_size)
            bucket_ranges.append((bucket_start, bucket_end))
            bucket_start = next_free = bucket_end
    return param_index_map, bucket_ranges


class ParamAndGradBuffer:
    """Contiguous gradient (and optionally parameter) storage for parameters of one dtype."""

    def __init__(self, params: list[Parameter], param_dtype: torch.dtype,
                 grad_dtype: torch.dtype, bucket_size: int | None,
                 data_parallel_world_size: int, use_distributed_optimizer: bool) -> None:
        if not params:
            raise ValueError("a ParamAndGradBuffer needs at least one parameter")
        if bucket_size is not None and bucket_size < 1:
            raise ValueError(f"bucket_size must be >= 1 element or None, got {bucket_size}")
        self.param_dtype = param_dtype
        self.grad_dtype = grad_dtype
        self.data_parallel_world_size = data_parallel_world_size
        self.params = list(params)
        self.param_index_map, bucket_ranges = plan_layout(
            self.params, bucket_size, data_parallel_world_size)
        self.numel = bucket_ranges[-1][1]
        device = self.params[0].device

        # Zeros, not empty: padding must read as zero gradient (ZeRO-1 reduces it too).
        self.grad_data = torch.zeros(self.numel, dtype=grad_dtype, device=device)
        self.param_data: Tensor | None = None
        if use_distributed_optimizer:
            self.param_data = torch.zeros(self.numel, dtype=param_dtype, device=device)

        for param, (start, end, _) in self.param_index_map.items():
            if self.param_data is not None:
                # The parameter moves into the buffer: same values, new (shared) storage.
                param_view = self.param_data[start:end].view(param.shape)
                param_view.copy_(param.data)
                param.data = param_view
            param.main_grad = self.grad_data[start:end].view(param.shape)

        params_per_bucket: list[list[Parameter]] = [[] for _ in bucket_ranges]
        for param, (_, _, bucket_index) in self.param_index_map.items():  # buffer order
            params_per_bucket[bucket_index].append(param)
        self.buckets: list[Bucket] = []
        for index, (start, end) in enumerate(bucket_ranges):
            ranges = [(self.param_index_map[p][0] - start, self.param_index_map[p][1] - start)
                      for p in params_per_bucket[index]]
            self.buckets.append(Bucket(
                index=index, params=params_per_bucket[index], param_ranges=ranges,
                offset=start, grad_data=self.grad_data[start:end],
                param_data=None if self.param_data is None else self.param_data[start:end]))
        self._check_invariants()

    def _check_invariants(self) -> None:
        """What ZeRO-1 and the comm hooks rely on; cheap, so always checked."""
        world_size = self.data_parallel_world_size
        assert self.numel % world_size == 0, "buffer must split evenly over the ranks"
        next_offset = 0
        for bucket in self.buckets:
            assert bucket.offset == next_offset, "buckets must tile the buffer without gaps"
            assert bucket.grad_data.numel() % world_size == 0, "bucket must split evenly"
            for param, (start, end) in zip(bucket.params, bucket.param_ranges):
                assert 0 <= start < end <= bucket.grad_data.numel(), "param outside its bucket"
                assert param.main_grad.data_ptr() == bucket.grad_data[start:].data_ptr()
                if self.param_data is not None:
                    assert param.data.data_ptr() == bucket.param_data[start:].data_ptr()
            next_offset += bucket.grad_data.numel()
        assert next_offset == self.numel

    def describe(self, param_names: dict[Parameter, str]) -> str:
        """A human-readable bucket -> parameters map (logged once at start)."""
        padding = self.numel - sum(p.numel() for p in self.params)
        lines = [f"grad buffer ({self.param_dtype} params, {self.grad_dtype} grads): "
                 f"{self.numel:,} elements in {len(self.buckets)} bucket(s), {padding} padding"]
        for bucket in self.buckets:
            end = bucket.offset + bucket.grad_data.numel()
            names = ", ".join(param_names.get(p, "?") for p in bucket.params)
            lines.append(f"  bucket {bucket.index} [{bucket.offset:,}, {end:,}): {names}")
        return "\n".join(lines)
