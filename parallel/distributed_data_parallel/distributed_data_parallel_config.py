"""The knobs of our DistributedDataParallel, in one screen."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DistributedDataParallelConfig:
    """How gradients are laid out in memory and reduced across data-parallel ranks."""

    bucket_size: int | None = 40_000_000
    """Elements per gradient bucket (a bucket closes once it holds at least this many); None =
    one bucket per buffer. Smaller buckets start communicating earlier in backward (more overlap)
    but pay the per-collective latency more often. 40M elements is Megatron-LM's default."""

    overlap_grad_reduce: bool = True
    """Launch a bucket's collective as soon as its last gradient arrives, while backward goes on
    computing the earlier layers; False = launch everything in `finish_grad_sync()`."""

    use_distributed_optimizer: bool = False
    """ZeRO-1: keep parameters in one contiguous `param_data` buffer too, and reduce-scatter
    (rank r keeps only the average of its shard) instead of all-reduce."""

    grad_reduce_in_fp32: bool = True
    """Accumulate and reduce gradients in fp32 even when parameters are bf16/fp16: micro-batch
    sums and the cross-rank sum keep full precision, at twice the bytes of a bf16 reduction."""

    allow_unused_params: bool = False
    """Allow parameters that get no gradient in a step (they contribute zeros). When False, such a
    step fails in `finish_grad_sync()` with the parameters' names."""
