"""RNG capture/restore: after restoring, every generator replays the same draws."""

from __future__ import annotations

import random

import numpy as np
import torch

from trainer.rng_state import capture_rng_state, restore_rng_state, seed_everything
from utils.checkpoint import load_torch


def _draws():
    return (random.random(), np.random.rand(3).tolist(), np.random.randn(),
            torch.rand(4).tolist(), torch.randint(0, 1000, (3,)).tolist())


def test_restore_replays_every_generator_after_weights_only_round_trip(tmp_path):
    seed_everything(random.SystemRandom().randrange(2**31))
    _draws()
    np.random.randn()  # leave a cached gaussian in numpy's state
    torch.save(capture_rng_state(), tmp_path / "rng.pt")
    expected = _draws()
    _draws()  # move on
    restore_rng_state(load_torch(tmp_path / "rng.pt"))
    assert _draws() == expected
