"""The inner AdamW that updates fp32 main params, and a uniform view of its per-param state.

Which implementation (fastest available first, all compute the same AdamW update,
Loshchilov & Hutter 2019):
1. apex `FusedAdam(adam_w_mode=True)`: CUDA params and apex installed (optional, never required);
2. torch `AdamW(fused=True)`: CUDA params (one multi-tensor kernel per step);
3. torch `AdamW(foreach=True)`: CPU (also ZeRO-1's CPU-offloaded shard) — batched tensor ops.

Checkpoints must not depend on which of these ran: a run saved on a node with apex resumes on
one without it, or on a CPU. Their `state_dict()`s differ (torch keeps `step` per tensor as a
tensor, apex per param group as an int; apex drops empty groups), so loading one into the other
fails (`KeyError: 'step'`) or silently restarts the bias correction. Every optimizer checkpoint
therefore stores the implementation-neutral form of `adam_state_dict`, per tensor in order:

    {"lr": 3e-4, "exp_avg": [m0, m1, ...], "exp_avg_sq": [v0, v1, ...], "step": [12, 12, ...]}

built from `read_adam_state` / `write_adam_state`, the per-tensor view ZeRO-1 also uses to move
moments between differently sharded optimizers.

Empty param groups (a ZeRO-1 shard may hold no vector params) never reach apex: `FusedAdam`
before March 2023 indexes the first param of every group and crashes on an empty one.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import Tensor

from optimizer.optimizer_config import OptimizerConfig
from utils.gpu_libraries import apex_extension_problem, import_optional, runs_gpu_kernels

Main = TypeVar("Main")  # what a group holds: the main tensors (or, to order a checkpoint, names)

# apex is optional: only its CUDA kernels (the compiled `amp_C` module) make it worth having
apex_fused_adam = import_optional("apex.optimizers", "FusedAdam",
                                  lambda: apex_extension_problem("amp_C"))


def adamw_implementation(device: torch.device) -> str:
    """Which AdamW runs for params on `device`, with the reason when not the fastest."""
    if not runs_gpu_kernels(device):
        return f"torch-foreach ({device.type}: no fused kernel)"
    if apex_fused_adam.value is None:
        return f"torch-fused ({apex_fused_adam.missing_reason})"
    return "apex-fused"


def build_adamw(param_groups: list[dict], config: OptimizerConfig) -> torch.optim.Optimizer:
    """AdamW over `param_groups` (each with its own `weight_decay`), picking the implementation
    by the params' device. Groups may be empty (a ZeRO-1 shard may hold no vector params)."""
    lr, betas, eps = config.lr, (config.adam_beta1, config.adam_beta2), config.adam_eps
    devices = [p.device for group in param_groups for p in group["params"]]
    implementation = adamw_implementation(devices[0]) if devices else "torch-foreach"
    if implementation == "apex-fused":
        non_empty = [group for group in param_groups if group["params"]]
        return apex_fused_adam.value(non_empty, lr=lr, betas=betas, eps=eps, adam_w_mode=True)
    if implementation.startswith("torch-fused"):
        return torch.optim.AdamW(param_groups, lr=lr, betas=betas, eps=eps, fused=True)
    return torch.optim.AdamW(param_groups, lr=lr, betas=betas, eps=eps, foreach=True)


def _is_apex(optimizer: torch.optim.Optimizer) -> bool:
    return apex_fused_adam.value is not None and isinstance(optimizer, apex_fused_adam.value)


def _group_of(optimizer: torch.optim.Optimizer, param: Tensor) -> dict:
    for group in optimizer.param_groups:
        if any(p is param for p in group["params"]):
            return group
    raise KeyError("tensor is not optimized by this optimizer")


def read_adam_state(optimizer: torch.optim.Optimizer,
                    param: Tensor) -> tuple[Tensor, Tensor, int]:
    """(exp_avg, exp_avg_sq, step) of one tensor; zeros and step 0 before its first update."""
    state = optimizer.state.get(param, {})
    if "exp_avg" not in state:
        return torch.zeros_like(param), torch.zeros_like(param), 0
    step = state["step"] if "step" in state else _group_of(optimizer, param).get("step", 0)
    return state["exp_avg"], state["exp_avg_sq"], int(step)


def write_adam_state(optimizer: torch.optim.Optimizer, param: Tensor, exp_avg: Tensor,
                     exp_avg_sq: Tensor, step: int) -> None:
    """Install Adam state for one tensor, in the layout the optimizer's own step() expects."""
    state = optimizer.state[param]
    state["exp_avg"] = exp_avg.to(device=param.device, dtype=torch.float32).clone()
    state["exp_avg_sq"] = exp_avg_sq.to(device=param.device, dtype=torch.float32).clone()
    if _is_apex(optimizer):
        _group_of(optimizer, param)["step"] = step
        return
    group = _group_of(optimizer, param)
    # torch's AdamW keeps `step` as a float32 tensor: on the param's device for the fused and
    # capturable kernels, on the CPU otherwise (torch/optim/adam.py, _init_group).
    on_device = group.get("fused") or group.get("capturable")
    state["step"] = torch.tensor(float(step), dtype=torch.float32,
                                 device=param.device if on_device else "cpu")


def adam_state_dict(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's Adam state in the implementation-neutral form (module docstring)."""
    states = [read_adam_state(optimizer, param) for param in _params(optimizer)]
    return {"lr": optimizer.param_groups[0]["lr"] if optimizer.param_groups else 0.0,
            "exp_avg": [exp_avg for exp_avg, _, _ in states],
            "exp_avg_sq": [exp_avg_sq for _, exp_avg_sq, _ in states],
            "step": [step for _, _, step in states]}


def load_adam_state_dict(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Install a state from `adam_state_dict` (saved by any implementation) into `optimizer`."""
    params = _params(optimizer)
    if len(state["step"]) != len(params):
        raise ValueError(f"optimizer state holds {len(state['step'])} tensors, this optimizer "
                         f"{len(params)}: the model or its trainable params changed")
    for param, exp_avg, exp_avg_sq, step in zip(params, state["exp_avg"], state["exp_avg_sq"],
                                                state["step"]):
        if exp_avg.shape != param.shape:
            raise ValueError(f"optimizer state of shape {tuple(exp_avg.shape)} for a tensor of "
                             f"shape {tuple(param.shape)}: the model changed")
        write_adam_state(optimizer, param, exp_avg, exp_avg_sq, step)
    for group in optimizer.param_groups:
        group["lr"] = state["lr"]


def _params(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    return [param for group in optimizer.param_groups for param in group["params"]]


def weight_decay_groups(model_and_main: list[tuple[Tensor, Main]],
                        weight_decay: float) -> list[dict]:
    """Two AdamW param groups over the main tensors: those of matrices (ndim >= 2: linear and
    embedding weights) decay, those of vectors (RMSNorm gains, biases) don't — decaying a norm's
    gain towards 0 only fights the normalisation (as in GPT-2/nanoGPT, LLaMA training recipes).
    A main tensor may be a flat slice of its model param (ZeRO-1), so the rule reads the model
    param's shape. The group order is that of a ZeRO-0 checkpoint, which names its tensors by
    grouping their names with this function (zero1_checkpoint.py `replicated_order`)."""
    decay = [main for model, main in model_and_main if model.ndim >= 2]
    no_decay = [main for model, main in model_and_main if model.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]
