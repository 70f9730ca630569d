"""Plain-torch emulations of the optional GPU libraries (flash-attn 2, apex), for tests.

Each fake implements the documented semantics of the functions z2all calls, including the
input checks the real kernels make (dtypes, layouts, head-dim limits, int32 offsets), so the
model's GPU branches run on a CPU-only machine and are compared with the torch paths. Every call
is counted in `CALLS`, so a test fails when a branch silently falls back to torch.

The fakes treat the device types in `EMULATED_GPU_DEVICE_TYPES` as the GPU, of compute
capability `EMULATED_CAPABILITY` (a test sets (7, 0) to play a V100). Like the real packages,
apex's kernels need its compiled extension modules (`amp_C`, `fused_layer_norm_cuda`; a test
removes them to play a source install without `--cuda_ext`), and flash-attn's causal mask is
aligned top-left below version 2.1 (a test sets `flash_attn.__version__`). What they cannot
emulate: the real kernels' speed, their bitwise rounding (they accumulate in fp32 like the
fakes, but in a different order), dropout RNG streams, and CUDA streams/NCCL.

`install(monkeypatch)` puts them in `sys.modules` under the real names (undone with the patch).
"""

from __future__ import annotations

import sys
from collections import Counter

import torch

EMULATED_GPU_DEVICE_TYPES = ("cuda", "cpu")
EMULATED_CAPABILITY = (8, 0)
CALLS: Counter[str] = Counter()

MODULE_NAMES = ["flash_attn", "flash_attn.layers", "flash_attn.layers.rotary", "flash_attn.ops",
                "flash_attn.ops.activations", "apex", "apex.normalization",
                "apex.normalization.fused_layer_norm", "apex.optimizers", "amp_C",
                "fused_layer_norm_cuda"]
APEX_EXTENSIONS = ("amp_C", "fused_layer_norm_cuda")


def device_capability(device: torch.device) -> tuple[int, int]:
    """The compute capability of a real CUDA device, or the emulated GPU's."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)
    return EMULATED_CAPABILITY


def check_on_gpu(*tensors: torch.Tensor) -> None:
    """The real kernels run on CUDA tensors of one device only."""
    devices = {tensor.device for tensor in tensors}
    if len(devices) != 1 or next(iter(devices)).type not in EMULATED_GPU_DEVICE_TYPES:
        raise RuntimeError(f"Input tensors must be on one (emulated) CUDA device, got {devices}")


def install(monkeypatch) -> None:
    """Replace flash_attn and apex (real or absent) by the fakes for one test."""
    import importlib

    for name in list(sys.modules):
        if name.split(".")[0] in ("flash_attn", "apex", *APEX_EXTENSIONS):
            monkeypatch.delitem(sys.modules, name)
    for name in MODULE_NAMES:
        monkeypatch.setitem(sys.modules, name,
                            importlib.import_module(f"tests.fake_gpu_libs.{name}"))
    CALLS.clear()
