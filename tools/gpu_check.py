"""`make gpu-check`, step 1: fail in one line when no CUDA device is visible; else print the node
and the kernel line that step 2 (`pytest -m cuda tests/test_gpu_check.py`) asserts.

Without this step a node whose venv holds the CPU wheel of torch (the pinned requirement) would
skip every `cuda` test, and the target would pass having checked nothing.

    $ make gpu-check        # on a laptop
    gpu-check: no CUDA device visible (torch 2.13.0+cpu, CUDA build: none); ...
"""

from __future__ import annotations

import sys

import torch

from model.kernels import kernel_choices
from optimizer.adamw import adamw_implementation

HEAD_DIM = 64  # a llama head size; flash-attn serves every head_dim up to 256


def no_cuda_message() -> str:
    return (f"gpu-check: no CUDA device visible (torch {torch.__version__}, CUDA build: "
            f"{torch.version.cuda or 'none'}); run it on a GPU node in the venv of "
            f"docs/gpu.md (make gpu-venv)")


def kernel_line(device: torch.device) -> str:
    """The implementations a bf16 run would use on `device`, as the trainer prints them."""
    choices = kernel_choices(device, torch.bfloat16, HEAD_DIM)
    choices["adamw"] = adamw_implementation(device)
    return "kernels: " + ", ".join(f"{op}={choice}" for op, choice in choices.items())


def main() -> int:
    if not torch.cuda.is_available():
        print(no_cuda_message(), file=sys.stderr)
        return 1
    device = torch.device("cuda")
    major, minor = torch.cuda.get_device_capability(device)
    print(f"gpu-check: {torch.cuda.device_count()} x {torch.cuda.get_device_name(device)} "
          f"(sm{major}{minor}), torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"gpu-check {kernel_line(device)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
