"""Optional GPU libraries (flash-attn, apex): import them if present, and say why if not.

The model and the optimizer run faster kernels from these packages when they are installed and
the tensors sit on a device their kernels serve. Neither is ever required: a missing package is
the normal CPU case, and a package built for another CUDA/torch raises on import. Both cases
fall back to torch, and the reason is kept so the run's kernel line can say why
("flash_attn not installed", "import failed: ...") instead of failing silently.

`KERNEL_DEVICE_TYPES` names the device types those kernels run on. Only CUDA in real use; the
tests add "cpu" and install plain-torch emulations of the libraries (tests/fake_gpu_libs), so
every GPU branch of the dispatch runs on a CPU-only machine.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch

KERNEL_DEVICE_TYPES: tuple[str, ...] = ("cuda",)


@dataclass(frozen=True)
class OptionalImport:
    """`value` is the imported object, or None and `missing_reason` says why."""
    value: Any
    missing_reason: str = ""


def import_optional(module: str, name: str) -> OptionalImport:
    """`module.name` from an optional package, or the one-line reason it is unusable."""
    try:
        return OptionalImport(getattr(importlib.import_module(module), name))
    except ModuleNotFoundError as error:
        package = module.split(".")[0]
        if error.name is not None and error.name.split(".")[0] == package:
            return OptionalImport(None, f"{package} not installed")
        return OptionalImport(None, f"import failed: {error}")
    except (ImportError, AttributeError, OSError, RuntimeError) as error:
        return OptionalImport(None, f"import failed: {type(error).__name__}: {error}")


def runs_gpu_kernels(device: torch.device) -> bool:
    """Whether the optional libraries' kernels serve tensors on `device`."""
    return device.type in KERNEL_DEVICE_TYPES
