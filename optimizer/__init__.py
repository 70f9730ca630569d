"""Every optimizer of the project, and the one factory that picks among them.

Read in this order: optimizer_config.py (knobs), grad_scaler.py (fp16 loss scale),
clip_grads.py (global norm across ranks), adamw.py (inner AdamW), state_header.py (the state
files' names and headers), optimizer.py (the step recipe and the fp32/fp16 wrappers),
distributed_optimizer/ (ZeRO-1: states sharded over ranks; its checkpoint loader also reads
ZeRO-0's file by parameter name), overlapped_adamw.py (AdamW stepped bucket by bucket from
DDP's comm hook), then factory.py (which one, and the `TrainingOptimizer` protocol the trainer
relies on).
"""

from optimizer.factory import TrainingOptimizer, get_optimizer
from optimizer.optimizer_config import OptimizerConfig

__all__ = ["OptimizerConfig", "TrainingOptimizer", "get_optimizer"]
