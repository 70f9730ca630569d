"""Capture and restore every random number generator a training step may touch.

Bitwise-identical resumption needs the exact generator states of each rank at the checkpoint:
Python's `random`, NumPy's legacy global generator, torch's CPU generator and, only where CUDA
is available, the generator of the CUDA device this rank computes on (calling CUDA RNG APIs on a
CPU-only machine would try to initialise CUDA). Only that one device: a rank never draws on the
others, and how many devices a process sees (8 without CUDA_VISIBLE_DEVICES, 1 with it) may
differ between the run that saved and the one that resumes. States are stored as tensors and
plain Python values so the file loads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng_state() -> dict[str, Any]:
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)),
                  "position": int(position), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached_gaussian)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["kind"], numpy_state["keys"].numpy().astype(np.uint32),
                         numpy_state["position"], numpy_state["has_gauss"],
                         numpy_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        device = torch.cuda.current_device()
        cuda_state = state["cuda"]
        if isinstance(cuda_state, list):  # checkpoints before this fix: every visible device's
            cuda_state = cuda_state[device] if device < len(cuda_state) else None
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state, device)


def seed_everything(seed: int) -> None:
    """Seed all generators (each rank passes its own seed where streams must differ)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device, lazily, without initialising CUDA
