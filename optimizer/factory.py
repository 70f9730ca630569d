"""`get_optimizer(config, ddp_model)`: the one place that picks an optimizer.

    overlap_step  use_distributed_optimizer  params_dtype  optimizer
    True          False                      fp32 / bf16   OverlappedAdamW (steps per bucket)
    False         True                       any           DistributedOptimizer (ZeRO-1)
    False         False                      fp32          FP32Optimizer (updates params in place)
    False         False                      bf16 / fp16   Float16OptimizerWithFloat16Params

Whatever it returns, the trainer sees only `TrainingOptimizer`: the methods it calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from torch import Tensor

from optimizer.distributed_optimizer import DistributedOptimizer
from optimizer.optimizer import (
    Float16OptimizerWithFloat16Params,
    FP32Optimizer,
    MixedPrecisionOptimizer,
    trainable_params,
)
from optimizer.optimizer_config import OptimizerConfig
from optimizer.overlapped_adamw import OverlappedAdamW
from parallel.distributed_data_parallel import DistributedDataParallel
from utils.precision import DTYPES


class TrainingOptimizer(Protocol):
    """What the training loop and its checkpoints call, in the order a step calls them."""

    def set_lr(self, lr: float) -> None: ...
    def zero_grad(self) -> None: ...            # zeros DDP's grad buffers
    def scale_loss(self, loss: Tensor) -> Tensor: ...   # fp16 loss scaling, else identity
    def step(self) -> tuple[bool, float]: ...   # (stepped, global grad norm)
    def finish_param_sync(self) -> None: ...    # the model holds the updated weights after it
    def save_checkpoint(self, optim_dir: str | Path) -> None: ...
    def checkpoint_files(self) -> list[str]: ...  # what all ranks' saves write to optim_dir
    def load_checkpoint(self, optim_dir: str | Path) -> None: ...
    def state_bytes(self) -> int: ...  # Adam's moments and fp32 copies (memory records)


def get_optimizer(config: OptimizerConfig, ddp_model: DistributedDataParallel
                  ) -> MixedPrecisionOptimizer | OverlappedAdamW:
    """Build the optimizer for a model wrapped in our DistributedDataParallel."""
    expected_dtype = DTYPES[config.params_dtype]
    wrong = {str(p.dtype) for p in trainable_params(ddp_model) if p.dtype != expected_dtype}
    if wrong:
        raise ValueError(f"params_dtype={config.params_dtype} but the model has params of dtype "
                         f"{sorted(wrong)}; cast the model before wrapping it")
    ddp_shards_grads = ddp_model.config.use_distributed_optimizer
    if ddp_shards_grads != config.use_distributed_optimizer:
        raise ValueError(
            f"OptimizerConfig.use_distributed_optimizer={config.use_distributed_optimizer} but "
            f"the DDP wrapper was built with use_distributed_optimizer={ddp_shards_grads}: "
            "ZeRO-1 needs DDP's reduce-scatter and param buffer, the others need all-reduce")
    if config.overlap_step:
        return OverlappedAdamW.from_config(config, ddp_model)
    if config.use_distributed_optimizer:
        return DistributedOptimizer(config, ddp_model)
    if config.params_dtype == "fp32":
        return FP32Optimizer(config, ddp_model)
    return Float16OptimizerWithFloat16Params(config, ddp_model)
