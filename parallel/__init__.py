"""Parallelism built from scratch: our DDP (bucketed gradient buffers, overlapped reduction)
and its comm hooks (all-reduce, bf16 compression, PowerSGD); the device grid
(parallel_dims.py), tensor and sequence parallelism (tensor_parallel/), pipeline parallelism
(pipeline_parallel/), context parallelism and ring attention (context_parallel/) and
layout-neutral checkpoints of a grid (layout_neutral_checkpoint.py); ZeRO-2/3's
ShardedDataParallel (sharded_data_parallel/), which answers the same `GradientSync` calls as
our DDP (gradient_sync.py), so the pipeline schedule drives either; the lazy CUDA side stream
of PowerSGD and the overlapped optimizer step (side_stream.py); both data-parallel wrappers
start every replica from the first rank's weights (replica_start.py). The mechanisms know no
model: what is our llama's lives in parallel_plan/."""
