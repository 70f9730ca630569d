"""Fake apex `fused_rms_norm_affine(input, weight, normalized_shape, eps, memory_efficient)`.

Semantics (apex/normalization/fused_layer_norm.py and its CUDA kernel): under autocast both
input and weight are first cast to the autocast dtype; the kernel needs weight of the input's
dtype and shape `normalized_shape` (the input's trailing dims), accumulates in fp32 and returns
x * rsqrt(mean(x^2) + eps) * weight in the input's dtype. The kernel is in the compiled
`fused_layer_norm_cuda` module, imported at the first call (ModuleNotFoundError without it).
"""

from __future__ import annotations

import importlib

import torch

from tests.fake_gpu_libs import CALLS, check_on_gpu


def fused_rms_norm_affine(input, weight, normalized_shape, eps=1e-6, memory_efficient=False):
    CALLS["fused_rms_norm_affine"] += 1
    importlib.import_module("fused_layer_norm_cuda")
    check_on_gpu(input, weight)
    device_type = input.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        input, weight = input.to(dtype), weight.to(dtype)
    normalized_shape = tuple(normalized_shape)
    if tuple(input.shape[-len(normalized_shape):]) != normalized_shape:
        raise RuntimeError(f"Expected input with shape [*, {normalized_shape}]")
    if tuple(weight.shape) != normalized_shape:
        raise RuntimeError("weight must have shape normalized_shape")
    if weight.dtype != input.dtype:
        raise RuntimeError(f"expected weight of dtype {input.dtype}, got {weight.dtype} (the "
                           f"mixed-dtype kernel is mixed_dtype_fused_rms_norm_affine)")
    dims = tuple(range(-len(normalized_shape), 0))
    x = input.contiguous().float()
    normed = x * torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + eps)
    return (normed * weight.contiguous().float()).to(input.dtype)
