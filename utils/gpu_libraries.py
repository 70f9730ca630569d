"""Optional GPU libraries (flash-attn, apex): import them if they will run, and say why if not.

The model and the optimizer run faster kernels from these packages when they are installed and
the tensors sit on a device their kernels serve. Neither is ever required: a missing package is
the normal CPU case, and a package built for another CUDA/torch raises on import. Both cases
fall back to torch, and the reason is kept so the run's kernel line can say why
("flash_attn not installed", "import failed: ...") instead of failing silently.

A package that imports is not yet a package that runs. Three traps, each probed here so that
it falls back (with its reason) instead of crashing at the first forward or step:
- apex installed from source without `--cpp_ext --cuda_ext` imports fine, but its kernels live
  in separately compiled modules (`fused_layer_norm_cuda` for the norms, `amp_C` for FusedAdam)
  that are then missing: `apex_extension_problem` imports them up front;
- flash-attn 2.0.x aligns the causal mask to the top-left corner when there are fewer queries
  than keys, so decoding after a KV cache would be silently wrong; 2.1 moved it to the
  bottom-right, which `model/kernels.py` relies on: `flash_attn_version_problem`;
- flash-attn 2 has kernels for Ampere (compute capability 8.0) and newer only; a V100 (7.0) or
  T4 (7.5) raises at the first call: `compute_capability`, asked per device by the model.

`KERNEL_DEVICE_TYPES` names the device types those kernels run on. Only CUDA in real use; the
tests add "cpu" and install plain-torch emulations of the libraries (tests/fake_gpu_libs, which
reject what the real ones reject), so every GPU branch of the dispatch runs on a CPU-only machine.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

KERNEL_DEVICE_TYPES: tuple[str, ...] = ("cuda",)
FLASH_ATTN_MIN_VERSION = (2, 1)        # bottom-right causal alignment (see module docstring)
FLASH_ATTN_MIN_CAPABILITY = (8, 0)     # Ampere
FLASH_ATTN_MAX_HEAD_DIM = 256          # flash-attn 2 kernels exist for head dims up to 256
FLASH_ATTN_DTYPES = (torch.float16, torch.bfloat16)
APEX_INSTALL_HINT = "reinstall apex with its CUDA extensions (docs/gpu.md)"


@dataclass(frozen=True)
class OptionalImport:
    """`value` is the imported object, or None and `missing_reason` says why."""
    value: Any
    missing_reason: str = ""


def import_optional(module: str, name: str,
                    problem: Callable[[], str] = lambda: "") -> OptionalImport:
    """`module.name` from an optional package, or the one-line reason it is unusable: it does
    not import, or `problem()` (called once it imports) names what would fail at run time."""
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as error:
        package = module.split(".")[0]
        if error.name is not None and error.name.split(".")[0] == package:
            return OptionalImport(None, f"{package} not installed")
        return OptionalImport(None, f"import failed: {error}")
    except (ImportError, AttributeError, OSError, RuntimeError) as error:
        return OptionalImport(None, f"import failed: {type(error).__name__}: {error}")
    reason = problem()
    return OptionalImport(None, reason) if reason else OptionalImport(value)


def apex_extension_problem(extension: str) -> str:
    """'' if apex's compiled CUDA extension module `extension` imports, else why not."""
    try:
        importlib.import_module(extension)
    except ModuleNotFoundError:
        return f"apex built without its CUDA extensions (no {extension}); {APEX_INSTALL_HINT}"
    except (ImportError, OSError, RuntimeError) as error:
        return f"apex extension {extension} failed to load: {type(error).__name__}: {error}"
    return ""


def parse_version(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '2.8.3' or '2.1.0.post1'."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"unreadable version {version!r}")
    return int(match.group(1)), int(match.group(2))


def flash_attn_version_problem() -> str:
    """'' if the installed flash-attn aligns causal masks bottom-right (>= 2.1), else why not."""
    version = getattr(importlib.import_module("flash_attn"), "__version__", "0.0")
    needed = ".".join(map(str, FLASH_ATTN_MIN_VERSION))
    try:
        too_old = parse_version(version) < FLASH_ATTN_MIN_VERSION
    except ValueError:
        return f"flash_attn version {version!r} unreadable (need >= {needed})"
    return (f"flash_attn {version} < {needed} (top-left causal mask breaks KV-cache decoding)"
            if too_old else "")


def import_flash_attn(name: str) -> OptionalImport:
    """`flash_attn.name` if flash-attn >= 2.1 is installed and imports, else why not."""
    return import_optional("flash_attn", name, flash_attn_version_problem)


def flash_attn_problem(device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """'' if flash-attn 2's kernels (once imported) run attention on activations on `device`
    in `dtype` with heads of `head_dim`, else the one-line reason (the model's attention and
    the context-parallel ring both ask)."""
    if not runs_gpu_kernels(device):
        return f"{device.type}: no GPU kernel"
    major, minor = compute_capability(device)
    if (major, minor) < FLASH_ATTN_MIN_CAPABILITY:
        return f"sm{major}{minor}: flash-attn 2 needs compute capability >= 8.0 (Ampere)"
    if dtype not in FLASH_ATTN_DTYPES:
        return f"{str(dtype).removeprefix('torch.')}: flash-attn runs fp16/bf16 only"
    if head_dim > FLASH_ATTN_MAX_HEAD_DIM:
        return f"head_dim {head_dim} > {FLASH_ATTN_MAX_HEAD_DIM}"
    return ""


def compute_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a kernel device (the tests replace this for
    their emulated GPU)."""
    return torch.cuda.get_device_capability(device)


def runs_gpu_kernels(device: torch.device) -> bool:
    """Whether the optional libraries' kernels serve tensors on `device`."""
    return device.type in KERNEL_DEVICE_TYPES
