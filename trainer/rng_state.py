"""Capture and restore every random number generator a training step may touch.

Bitwise-identical resumption needs the exact generator states of each rank at the checkpoint:
Python's `random`, NumPy's legacy global generator, torch's CPU generator and, only where CUDA
is available, every CUDA device's generator (calling CUDA RNG APIs on a CPU-only machine would
try to initialise CUDA). States are stored as tensors and plain Python values so the file loads
with `torch.load(weights_only=True)`.
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
        state["cuda"] = torch.cuda.get_rng_state_all()
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
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    """Seed all generators (each rank passes its own seed where streams must differ)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device, lazily, without initialising CUDA
