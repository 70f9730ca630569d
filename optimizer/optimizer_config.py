"""Every optimizer knob in one place; `optimizer.get_optimizer(config, ddp_model)` reads it.

Only the settings the optimizer wrappers need live here: AdamW's hyper-parameters, clipping,
the precision of the model's parameters, the ZeRO-1 switches and the fp16 loss-scaler schedule.
The learning-rate *schedule* belongs to the trainer, which calls `optimizer.set_lr(lr)` each step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ParamsDtype = Literal["fp32", "bf16", "fp16"]


@dataclass
class OptimizerConfig:
    lr: float = 6e-4
    """Peak learning rate; the trainer's schedule overrides it every step via `set_lr`."""
    weight_decay: float = 0.1
    """Decoupled weight decay (AdamW); applied only to parameters with ndim >= 2."""
    adam_beta1: float = 0.9
    """Decay rate of Adam's first-moment (mean of gradients) estimate."""
    adam_beta2: float = 0.95
    """Decay rate of Adam's second-moment (mean of squared gradients) estimate."""
    adam_eps: float = 1e-8
    """Added to the denominator sqrt(v) for numerical stability."""
    clip_grad: float = 1.0
    """Clip the global L2 norm of all gradients to this value; 0 disables clipping."""
    params_dtype: ParamsDtype = "fp32"
    """dtype of the model's parameters. bf16/fp16 get fp32 master copies in the optimizer."""
    use_distributed_optimizer: bool = False
    """ZeRO-1: each data-parallel rank keeps master params + Adam state for 1/W of the model.
    Needs the DDP wrapper built with the same flag (it then reduce-scatters gradients)."""
    overlap_param_gather: bool = False
    """ZeRO-1 only: all-gather updated params asynchronously, bucket by bucket, and wait for a
    bucket just before the forward of the first module that uses it."""
    cpu_offload: bool = False
    """ZeRO-1 only: keep fp32 master params + Adam state in (pinned) CPU memory and run the
    AdamW update there (the ZeRO-Offload idea); costs host<->device copies every step."""
    overlap_step: bool = False
    """Step AdamW bucket by bucket as each bucket's gradients are reduced (OverlappedAdamW: the
    optimizer becomes DDP's comm hook). Needs clip_grad=0, no fp16 and no ZeRO-1."""
    initial_loss_scale: float = 2.0**16
    """fp16 only: starting value of the dynamic loss scale."""
    min_loss_scale: float = 1.0
    """fp16 only: the scale never backs off below this."""
    loss_scale_window: int = 1000
    """fp16 only: after this many consecutive steps without inf/NaN the scale doubles."""
    hysteresis: int = 2
    """fp16 only: how many overflowing steps (counted since the last growth) are tolerated
    before the scale is halved; every overflowing step is skipped regardless."""

    def __post_init__(self) -> None:
        if self.params_dtype not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"params_dtype must be fp32, bf16 or fp16, got {self.params_dtype!r}")
        if self.clip_grad < 0:
            raise ValueError(f"clip_grad must be >= 0 (0 disables), got {self.clip_grad}")
        if not self.use_distributed_optimizer and (self.overlap_param_gather or self.cpu_offload):
            raise ValueError("overlap_param_gather and cpu_offload need use_distributed_optimizer")
        if self.loss_scale_window < 1 or self.hysteresis < 1:
            raise ValueError("loss_scale_window and hysteresis must be >= 1")
