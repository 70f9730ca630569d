"""Data parallelism built from scratch: our DDP, comm hooks and the ZeRO-1 optimizer."""
