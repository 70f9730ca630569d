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


class FakeCudaGenerators:
    """Stand-in for torch.cuda's RNG API with `visible` devices, each with its own state; like
    torch, naming a device that is not visible raises IndexError."""

    def __init__(self, visible: int, current: int) -> None:
        self.visible, self.current = visible, current
        self.states = {i: torch.randint(0, 256, (16,), dtype=torch.uint8) for i in range(visible)}

    def _check(self, device: int) -> int:
        if not 0 <= device < self.visible:
            raise IndexError(f"CUDA device {device} of {self.visible}")
        return device

    def install(self, monkeypatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(cuda, "get_rng_state",
                            lambda device=0: self.states[self._check(device)].clone())
        monkeypatch.setattr(cuda, "set_rng_state", lambda state, device=0: self.states.__setitem__(
            self._check(device), state.clone()))
        monkeypatch.setattr(cuda, "get_rng_state_all",
                            lambda: [self.states[i].clone() for i in range(self.visible)])
        monkeypatch.setattr(cuda, "set_rng_state_all", lambda states: [
            cuda.set_rng_state(state, i) for i, state in enumerate(states)])


def test_cuda_state_of_this_ranks_device_resumes_with_fewer_visible_devices(monkeypatch):
    """Saved by rank 3 of a process seeing all 4 GPUs, resumed by a process that sees only its
    own GPU (CUDA_VISIBLE_DEVICES): the state of rank 3's device lands on device 0."""
    saving = FakeCudaGenerators(visible=4, current=3)
    saving.install(monkeypatch)
    state = capture_rng_state()
    resuming = FakeCudaGenerators(visible=1, current=0)
    resuming.install(monkeypatch)
    restore_rng_state(state)
    assert torch.equal(resuming.states[0], saving.states[3])


def test_checkpoint_with_every_devices_state_restores_this_ranks_device(monkeypatch):
    """Checkpoints written before the fix hold a list (every visible device's state)."""
    saving = FakeCudaGenerators(visible=4, current=2)
    saving.install(monkeypatch)
    state = {**capture_rng_state(), "cuda": torch.cuda.get_rng_state_all()}
    resuming = FakeCudaGenerators(visible=4, current=2)
    resuming.install(monkeypatch)
    restore_rng_state(state)
    assert torch.equal(resuming.states[2], saving.states[2])
    assert not torch.equal(resuming.states[1], saving.states[1])  # only this rank's device
