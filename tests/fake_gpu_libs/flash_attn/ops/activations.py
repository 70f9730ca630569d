"""Fake `flash_attn.ops.activations.swiglu(x, y)` = silu(x) * y, in fp32, returned in x's dtype
(the real one is a jiterator kernel computing in fp32 for half inputs)."""

from __future__ import annotations

import torch.nn.functional as F

from tests.fake_gpu_libs import CALLS, check_on_gpu


def swiglu(x, y):
    CALLS["swiglu"] += 1
    check_on_gpu(x, y)
    if x.shape != y.shape or x.dtype != y.dtype:
        raise RuntimeError("swiglu: x and y must have the same shape and dtype")
    return (F.silu(x.float()) * y.float()).to(x.dtype)
