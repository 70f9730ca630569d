"""Optimizers: fp32 and mixed-precision (fp32 master weights, loss scaling), one factory.

Read in this order: optimizer_config.py (knobs), grad_scaler.py (fp16 loss scale),
clip_grads.py (global norm across ranks), adamw.py (inner AdamW), optimizer.py (the step
recipe and the fp32/fp16 wrappers), factory.py (which wrapper), then
parallel/distributed_optimizer/ (ZeRO-1).
"""

from optimizer.factory import get_optimizer
from optimizer.optimizer_config import OptimizerConfig

__all__ = ["OptimizerConfig", "get_optimizer"]
