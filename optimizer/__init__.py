"""Optimizers: fp32 and mixed-precision (fp32 master weights, loss scaling)."""
