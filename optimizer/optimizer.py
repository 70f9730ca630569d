"""Optimizer wrappers: fp32 main params, loss scaling, global clipping, checkpoints.

Mixed precision (Micikevicius et al. 2018) keeps two copies of every weight: the model's
fp16/bf16 params, used by forward and backward, and fp32 *main* params (a.k.a. master weights)
that AdamW updates. Tiny updates (lr * m / sqrt(v) is often < 1e-3 of the weight) would round
away in 16-bit; in fp32 they accumulate. One `step()` is the same recipe for every wrapper:

    Step 1  point each main param's .grad at its fp32 gradient (from DDP's `param.main_grad`)
    Step 2  fp16 only: divide by the loss scale, check for inf/NaN on all ranks, maybe skip
    Step 3  global grad norm (see clip_grads.py for how ranks avoid double counting) and clip
    Step 4  AdamW updates the fp32 main params
    Step 5  copy main params back into the model params (ZeRO-1: then all-gather them)

The wrappers differ only in Steps 1 and 5, which subclasses implement:
- `FP32Optimizer`: the model params are fp32 already and *are* the main params;
- `Float16OptimizerWithFloat16Params`: bf16/fp16 model params + a full fp32 copy on every rank;
- `optimizer.distributed_optimizer.DistributedOptimizer` (ZeRO-1): fp32 copies of 1/W of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from optimizer.adamw import (
    adam_state_dict,
    build_adamw,
    load_adam_state_dict,
    weight_decay_groups,
)
from optimizer.clip_grads import clip_grads_, global_grad_norm, unscale_and_check_for_inf_
from optimizer.distributed_optimizer.zero1_checkpoint import load_resharded_state, replicated_order
from optimizer.grad_scaler import DynamicGradScaler
from optimizer.optimizer_config import OptimizerConfig
from optimizer.state_header import (
    REPLICATED_CHECKPOINT_FILE,
    REPLICATED_STATE_VERSION,
    STATE_FORMAT,
    check_state_header,
)
from parallel.distributed_data_parallel import DistributedDataParallel
from parallel.sharded_data_parallel import ShardedDataParallel
from utils.atomic_io import atomic_open

# The wrappers an optimizer reads gradients from: our DDP (whole `main_grad`s, stages 0 and 1)
# or ZeRO-2/3's ShardedDataParallel (each rank's gradient shard).
DataParallelModel = DistributedDataParallel | ShardedDataParallel

@dataclass(frozen=True)
class MainPiece:
    """Elements [start, end) of a model parameter (flattened) and the fp32 tensor AdamW updates
    for them: a whole parameter, or (ZeRO-1/2/3) the part of it in this rank's shard. What code
    outside the optimizer addresses the optimizer state by (a grid's whole-model gradient norm
    and its layout-neutral checkpoint), whatever the wrapper."""

    param: Tensor
    start: int
    end: int
    main: Tensor
    grad: Tensor
    """The same elements' reduced gradient where the wrapper keeps it (flat; DDP's
    `main_grad`, ZeRO-2/3's grad shard): what `step()` reads, so scaling it clips."""


def build_grad_scaler(config: OptimizerConfig) -> DynamicGradScaler | None:
    """fp16 needs a dynamic loss scale; fp32 and bf16 (fp32's exponent range) need none."""
    if config.params_dtype != "fp16":
        return None
    return DynamicGradScaler(config.initial_loss_scale, config.min_loss_scale,
                             config.loss_scale_window, config.hysteresis)


def trainable_params(ddp_model: DataParallelModel) -> list[Tensor]:
    """The wrapped model's params that get gradients (tied weights appear once)."""
    return [param for param in ddp_model.module.parameters() if param.requires_grad]


def model_grad(param: Tensor) -> Tensor:
    """The DDP-reduced gradient of a model param (`param.main_grad`, a view into a grad buffer)."""
    grad = getattr(param, "main_grad", None)
    if grad is None:
        raise RuntimeError("parameter has no .main_grad: wrap the model in "
                           "parallel.distributed_data_parallel.DistributedDataParallel and call "
                           "finish_grad_sync() before optimizer.step()")
    return grad


class MixedPrecisionOptimizer:
    """The step recipe above plus lr, loss scaling and (de)serialisation; see module doc."""

    def __init__(self, config: OptimizerConfig, ddp_model: DataParallelModel,
                 model_and_main: list[tuple[Tensor, Tensor]], grads_sharded: bool) -> None:
        """`model_and_main`: each model param (or its piece) with the fp32 tensor AdamW
        updates for it; every wrapper's AdamW gets the same two groups (`weight_decay_groups`)."""
        self.config = config
        self.ddp_model = ddp_model
        self.inner = build_adamw(weight_decay_groups(model_and_main, config.weight_decay), config)
        self.grad_scaler = build_grad_scaler(config)
        self.grads_sharded = grads_sharded
        self.process_group = ddp_model.process_group

    # ---- the two steps that differ per wrapper ------------------------------------------------
    def _prepare_main_grads(self) -> None:
        """Step 1: set `.grad` (fp32) of every tensor the inner optimizer updates."""
        raise NotImplementedError

    def _copy_main_params_to_model_params(self) -> None:
        """Step 5: make the model params equal to the updated main params."""
        raise NotImplementedError

    def main_pieces(self) -> list[MainPiece]:
        """Every piece of a model parameter whose update this rank computes (MainPiece)."""
        raise NotImplementedError

    @torch.no_grad()
    def copy_main_params_to_model(self) -> None:
        """After the main params were written from outside (a layout-neutral checkpoint): the
        model params take their values (ZeRO-1: all-gathered), nothing left in flight."""
        self._copy_main_params_to_model_params()
        self.finish_param_sync()

    # ---- the shared recipe ---------------------------------------------------------------------
    def _main_params(self) -> list[Tensor]:
        return [p for group in self.inner.param_groups for p in group["params"]]

    def _release_main_grads(self) -> None:
        """Drop the .grad references (views or fp32 copies) so nothing stale reaches next step."""
        for param in self._main_params():
            param.grad = None

    @torch.no_grad()
    def step(self) -> tuple[bool, float]:
        """One update. Returns (stepped, grad_norm); a skipped step returns (False, nan)."""
        self._prepare_main_grads()
        grads = [p.grad for p in self._main_params()]
        if self.grad_scaler is not None:  # Step 2
            found_inf = unscale_and_check_for_inf_(grads, self.grad_scaler.inv_scale,
                                                   self.process_group)
            self.grad_scaler.update(found_inf)
            if found_inf:
                self._release_main_grads()
                return False, float("nan")
        grad_norm = global_grad_norm(grads, sharded=self.grads_sharded,  # Step 3
                                     group=self.process_group)
        if not math.isfinite(grad_norm):
            # bf16/fp32 have no scaler, but an inf/NaN gradient would still poison every weight
            # (clipping multiplies all grads by 1/inf = 0, and inf * 0 = NaN). The norm is
            # global, so every rank takes this branch together.
            self._release_main_grads()
            return False, grad_norm
        if self.config.clip_grad > 0:
            clip_grads_(grads, self.config.clip_grad, grad_norm)
        self.inner.step()  # Step 4
        self._release_main_grads()
        self._copy_main_params_to_model_params()  # Step 5
        return True, grad_norm

    def zero_grad(self) -> None:
        """Zero DDP's grad buffers (where `main_grad` lives) before the next accumulation."""
        self.ddp_model.zero_grad_buffer()
        self._release_main_grads()

    def scale_loss(self, loss: Tensor) -> Tensor:
        """Multiply the loss by the fp16 loss scale before backward; identity otherwise."""
        return loss if self.grad_scaler is None else loss * self.grad_scaler.scale

    def set_lr(self, lr: float) -> None:
        for group in self.inner.param_groups:
            group["lr"] = lr

    def get_lr(self) -> float:
        return self.inner.param_groups[0]["lr"]

    def finish_param_sync(self) -> None:
        """Wait until the model params hold the last step's values. Only ZeRO-1 with
        overlap_param_gather leaves work in flight; call this before reading params outside a
        forward (e.g. saving the model)."""

    def state_bytes(self) -> int:
        """Bytes of optimizer state held on top of the model: Adam's moments and fp32 copies."""
        tensors = [value for state in self.inner.state.values() for value in state.values()
                   if isinstance(value, Tensor)]
        tensors += self._saved_main_params()
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def loss_scale(self) -> float:
        return 1.0 if self.grad_scaler is None else self.grad_scaler.scale

    # ---- checkpoints: one replicated state, written by rank 0, read by every rank ---------------
    def state_dict(self) -> dict[str, Any]:
        """Adam's state in the neutral form, so that any AdamW implementation can resume it."""
        return {"format": STATE_FORMAT, "version": REPLICATED_STATE_VERSION,
                "kind": type(self).__name__, "adam": adam_state_dict(self.inner),
                "grad_scaler": None if self.grad_scaler is None else self.grad_scaler.state_dict(),
                "main_params": self._saved_main_params()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state_header(state, STATE_FORMAT, type(self).__name__, REPLICATED_STATE_VERSION)
        if (state["grad_scaler"] is None) != (self.grad_scaler is None):
            raise ValueError("checkpoint and config disagree on fp16 loss scaling "
                             f"(params_dtype={self.config.params_dtype})")
        load_adam_state_dict(self.inner, state["adam"])
        if self.grad_scaler is not None:
            self.grad_scaler.load_state_dict(state["grad_scaler"])
        self._load_main_params(state["main_params"])

    def _saved_main_params(self) -> list[Tensor]:
        """fp32 main params worth saving (the model checkpoint has only their 16-bit rounding)."""
        return []

    def _load_main_params(self, main_params: list[Tensor]) -> None:
        if main_params:
            raise ValueError(f"{type(self).__name__} keeps no separate main params")

    def save_checkpoint(self, optim_dir: str | Path) -> None:
        """Rank 0 writes `optim_dir/optimizer.pt` atomically (the state is the same everywhere)."""
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        with atomic_open(Path(optim_dir) / REPLICATED_CHECKPOINT_FILE, "wb") as handle:
            torch.save(self.state_dict(), handle)

    def checkpoint_files(self) -> list[str]:
        return [REPLICATED_CHECKPOINT_FILE]

    def load_checkpoint(self, optim_dir: str | Path) -> None:
        """This layout's `optimizer.pt`, or another layout's pieces (ZeRO-1/2/3, a grid)."""
        path = Path(optim_dir) / REPLICATED_CHECKPOINT_FILE
        if path.is_file():
            self.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        else:
            self.load_state_dict(self._state_from_pieces(Path(optim_dir)))

    def _state_from_pieces(self, optim_dir: Path) -> dict[str, Any]:
        """The state this optimizer would have saved, from a save of pieces by name: each
        tensor gathered whole (the re-cutting loader at world size 1, whole-parameter pieces),
        the Adam state in the param-group order (`replicated_order`), the main params in the
        module's (as `state_dict` lists them)."""
        shapes, trainable = self._param_shapes(), self._trainable_names()
        whole = load_resharded_state(optim_dir, [(name, 0, math.prod(shapes[name]))
                                                 for name in trainable],
                                     shapes, rank=0, world_size=1, trainable=trainable)
        pieces = {piece["name"]: piece for piece in whole["pieces"]}

        def tensors(key: str, names: list[str]) -> list[Tensor]:
            return [pieces[name][key].view(shapes[name]) for name in names]

        in_groups = replicated_order(shapes, trainable)
        return {"format": STATE_FORMAT, "version": REPLICATED_STATE_VERSION,
                "kind": type(self).__name__, "grad_scaler": whole["grad_scaler"],
                "adam": {"lr": whole["lr"], "exp_avg": tensors("exp_avg", in_groups),
                         "exp_avg_sq": tensors("exp_avg_sq", in_groups),
                         "step": [pieces[name]["step"] for name in in_groups]},
                "main_params": (tensors("main_param", trainable)
                                if self._saved_main_params() else [])}

    def _param_shapes(self) -> dict[str, list[int]]:
        """{name: shape} of every parameter of the wrapped module, in its order (what a shard
        file records to refuse another model)."""
        return {name: list(param.shape) for param, name in self.ddp_model.param_names.items()}

    def _trainable_names(self) -> list[str]:
        """The names of the parameters with optimizer state (with LoRA: only the adapters)."""
        return [name for param, name in self.ddp_model.param_names.items()
                if param.requires_grad]


class FP32Optimizer(MixedPrecisionOptimizer):
    """fp32 model params are updated in place: the main params are the model params."""

    def __init__(self, config: OptimizerConfig, ddp_model: DistributedDataParallel) -> None:
        params = trainable_params(ddp_model)
        super().__init__(config, ddp_model, [(p, p) for p in params], grads_sharded=False)

    def _prepare_main_grads(self) -> None:
        for param in self._main_params():
            # The view is dropped again after the step; leaving it as .grad would make autograd
            # accumulate into the buffer directly *and* via DDP's hook (counted twice).
            param.grad = model_grad(param)

    def _copy_main_params_to_model_params(self) -> None:
        pass  # updated in place

    def main_pieces(self) -> list[MainPiece]:
        return [MainPiece(param, 0, param.numel(), param, model_grad(param).view(-1))
                for param in self._main_params()]


class Float16OptimizerWithFloat16Params(MixedPrecisionOptimizer):
    """bf16/fp16 model params; every rank keeps a full fp32 main copy (no sharding)."""

    def __init__(self, config: OptimizerConfig, ddp_model: DistributedDataParallel) -> None:
        self.model_params = trainable_params(ddp_model)
        self.main_params = [param.detach().clone().float() for param in self.model_params]
        super().__init__(config, ddp_model, list(zip(self.model_params, self.main_params)),
                         grads_sharded=False)

    def _prepare_main_grads(self) -> None:
        for model_param, main_param in zip(self.model_params, self.main_params):
            grad = model_grad(model_param)
            # grad_reduce_in_fp32: the buffer is fp32 already, use it as is (no copy).
            main_param.grad = grad if grad.dtype == torch.float32 else grad.float()

    def _copy_main_params_to_model_params(self) -> None:
        for model_param, main_param in zip(self.model_params, self.main_params):
            model_param.detach().copy_(main_param)  # rounds fp32 -> bf16/fp16

    def main_pieces(self) -> list[MainPiece]:
        return [MainPiece(model_param, 0, model_param.numel(), main_param,
                          model_grad(model_param).view(-1))
                for model_param, main_param in zip(self.model_params, self.main_params)]

    def _saved_main_params(self) -> list[Tensor]:
        return self.main_params

    def _load_main_params(self, main_params: list[Tensor]) -> None:
        if len(main_params) != len(self.main_params):
            raise ValueError(f"checkpoint has {len(main_params)} main params, model has "
                             f"{len(self.main_params)}")
        with torch.no_grad():
            for main_param, saved in zip(self.main_params, main_params):
                main_param.copy_(saved)
            self._copy_main_params_to_model_params()
