"""Fake apex `FusedAdam` (adam_w_mode=True: AdamW; Loshchilov & Hutter 2019).

Semantics (apex/optimizers/fused_adam.py and multi_tensor_adam.cu): `step` is counted per param
group (group["step"]), moments live in state["exp_avg"] / state["exp_avg_sq"] with the param's
dtype, the math runs in fp32:
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    p -= lr * ((m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * p)
Params must be fp16, bf16 or fp32 on the GPU. Releases before March 2023 read
group["params"][0] of every group, so an empty group raises IndexError; the fake does too.
The constructor needs the compiled `amp_C` module, as the real one does.
"""

from __future__ import annotations

import importlib

import torch

from tests.fake_gpu_libs import CALLS, check_on_gpu


class FusedAdam(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True,
                 capturable=False, master_weights=False):
        try:
            importlib.import_module("amp_C")
        except ImportError as error:
            raise RuntimeError("apex.optimizers.FusedAdam requires cuda extensions") from error
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if capturable or master_weights or not adam_w_mode:
            raise NotImplementedError("not emulated: capturable, master_weights, L2 mode")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        CALLS["FusedAdam.step"] += 1
        for group in self.param_groups:
            group["params"][0].device  # noqa: B018 - the pre-March-2023 crash on empty groups
            group["step"] = group.get("step", 0) + 1
            beta1, beta2 = group["betas"]
            step = group["step"]
            correction1 = 1 - beta1 ** step if group["bias_correction"] else 1.0
            correction2 = 1 - beta2 ** step if group["bias_correction"] else 1.0
            for param in group["params"]:
                if param.grad is None:
                    continue
                check_on_gpu(param, param.grad)
                if param.dtype not in (torch.float16, torch.bfloat16, torch.float32):
                    raise RuntimeError("FusedAdam only support fp16, bf16 and fp32.")
                state = self.state[param]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                grad, p = param.grad.float(), param.float()
                exp_avg = state["exp_avg"].float() * beta1 + (1 - beta1) * grad
                exp_avg_sq = state["exp_avg_sq"].float() * beta2 + (1 - beta2) * grad * grad
                denominator = (exp_avg_sq / correction2).sqrt() + group["eps"]
                update = (exp_avg / correction1) / denominator + group["weight_decay"] * p
                param.copy_(p - group["lr"] * update)
                state["exp_avg"].copy_(exp_avg)
                state["exp_avg_sq"].copy_(exp_avg_sq)
