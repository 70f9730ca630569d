"""What a training checkpoint holds and how all ranks write and read it together.

    ckpt/step_000200/
      config.json, model.safetensors   the model (rank 0; `Z2allForCausalLM.from_pretrained`)
      optim/                           the optimizer (ZeRO-1: one shard file per rank)
      trainer_state.pt                 step, consumed samples, tokens, sampler state, LR
                                       schedule, run config (rank 0)
      ranks/rank_00000.pt ...          per rank: every RNG state, comm-hook state (PowerSGD's
                                       error feedback and Q matrices differ on each rank),
                                       the data stream's position (--data_format=stream)
      manifest.json                    written last (utils.checkpoint)

The protocol: rank 0 creates the temp dir; barrier; every rank writes its files; barrier;
rank 0 seals it (manifest, rename); barrier, so no rank runs ahead and e.g. exits while the
checkpoint is still a temp dir. Everything is loaded with `weights_only=True`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from utils.atomic_io import atomic_open
from utils.checkpoint import (
    TRAINER_STATE,
    begin_checkpoint,
    finish_checkpoint,
    load_torch,
    step_dir_name,
)
from utils.distributed_env import DistributedEnv, barrier
from utils.rng_state import capture_rng_state

RANKS_DIR = "ranks"
TRAINER_STATE_FORMAT = "z2all-trainer-state"


def _rank_file(ckpt_dir: Path, rank: int) -> Path:
    return ckpt_dir / RANKS_DIR / f"rank_{rank:05d}.pt"


def _save_torch(obj: Any, path: Path) -> None:
    with atomic_open(path, "wb") as handle:
        torch.save(obj, handle)


def save_training_checkpoint(env: DistributedEnv, ckpt_root: Path, step: int, *, model: Any,
                             optimizer: Any, trainer_state: dict[str, Any],
                             comm_hook_state: dict[str, Any] | None, keep_last: int,
                             val_loss: float | None,
                             data_state: dict[str, Any] | None = None) -> Path:
    """Collective: every rank must call it at the same step. Returns the checkpoint dir."""
    if env.is_main:
        begin_checkpoint(ckpt_root, step)
    barrier(env)
    tmp_dir = ckpt_root / f".tmp_{step_dir_name(step)}"
    optimizer.save_checkpoint(tmp_dir / "optim")
    _save_torch({"rng": capture_rng_state(), "comm_hook": comm_hook_state, "data": data_state},
                _rank_file(tmp_dir, env.rank))
    if env.is_main:
        model.save_pretrained(tmp_dir)
        _save_torch({"format": TRAINER_STATE_FORMAT, "version": 1, **trainer_state,
                     "world_size": env.world_size}, tmp_dir / TRAINER_STATE)
    barrier(env)
    final_dir = ckpt_root / step_dir_name(step)
    if env.is_main:
        finish_checkpoint(tmp_dir, step, keep_last=keep_last, val_loss=val_loss)
    barrier(env)
    return final_dir


def load_trainer_state(ckpt_dir: Path) -> dict[str, Any]:
    state = load_torch(ckpt_dir / TRAINER_STATE)
    if state.get("format") != TRAINER_STATE_FORMAT or state.get("version") != 1:
        raise ValueError(f"{ckpt_dir / TRAINER_STATE}: not a z2all trainer state (v1)")
    return state


def load_rank_state(ckpt_dir: Path, env: DistributedEnv, saved_world_size: int
                    ) -> dict[str, Any] | None:
    """This rank's RNG + comm-hook state, or None when the world size changed (then the
    caller reseeds: the run continues correctly but is no longer bitwise reproducible)."""
    if saved_world_size != env.world_size:
        return None
    state = load_torch(_rank_file(ckpt_dir, env.rank))
    # RNG states stay CPU byte tensors (that is what torch's setters take); the comm hook's
    # tensors (PowerSGD's error feedback and Q) go back to the device the gradients live on.
    state["comm_hook"] = _to_device(state["comm_hook"], env.device)
    return state


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {key: _to_device(item, device) for key, item in value.items()}
    return value


def load_data_states(ckpt_dir: Path, saved_world_size: int) -> list[dict[str, Any] | None]:
    """The data stream position of every rank that wrote the checkpoint (for a resume under
    another world size, which must see all old positions to avoid repeating samples)."""
    return [load_torch(_rank_file(ckpt_dir, rank)).get("data")
            for rank in range(saved_world_size)]
