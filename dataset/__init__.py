"""Memory-mapped datasets for pretraining, SFT and DPO, and a checkpointable sampler."""
