"""`get_optimizer(config, ddp_model)`: the one place that picks an optimizer wrapper.

    use_distributed_optimizer  params_dtype   wrapper
    True                       any            DistributedOptimizer (ZeRO-1, fp32 main shard)
    False                      fp32           FP32Optimizer (updates the params in place)
    False                      bf16 / fp16    Float16OptimizerWithFloat16Params (fp32 copies)
"""

from __future__ import annotations

from typing import Any

from optimizer.optimizer import (
    Float16OptimizerWithFloat16Params,
    FP32Optimizer,
    MixedPrecisionOptimizer,
    trainable_params,
)
from optimizer.optimizer_config import OptimizerConfig
from utils.precision import DTYPES


def get_optimizer(config: OptimizerConfig, ddp_model: Any) -> MixedPrecisionOptimizer:
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
    if config.use_distributed_optimizer:
        # Imported here: the distributed optimizer builds on optimizer.optimizer, so importing
        # it at the top would make the two packages import each other.
        from parallel.distributed_optimizer import DistributedOptimizer

        return DistributedOptimizer(config, ddp_model)
    if config.params_dtype == "fp32":
        return FP32Optimizer(config, ddp_model)
    return Float16OptimizerWithFloat16Params(config, ddp_model)
