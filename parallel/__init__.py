"""Data parallelism built from scratch: our DDP (bucketed gradient buffers, overlapped
reduction) and its comm hooks (all-reduce, bf16 compression, PowerSGD)."""
