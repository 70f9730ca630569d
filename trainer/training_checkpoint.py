"""What a training checkpoint holds and how all ranks write and read it together.

    ckpt/step_000200/
      config.json, model.safetensors   the model (rank 0; `Z2allForCausalLM.from_pretrained`);
                                       a LoRA run: lora.json + lora_adapters.safetensors
                                       instead, the adapters and a reference to the frozen
                                       base (model/lora_checkpoint.py)
      optim/                           the optimizer (ZeRO-1: one shard file per rank)
      trainer_state.pt                 step, consumed samples, tokens, run config (rank 0);
                                       the LR is a function of the step
      ranks/rank_00000.pt ...          per rank: every RNG state, comm-hook state (PowerSGD's
                                       error feedback and Q matrices differ on each rank),
                                       the training data's position (dataset/train_data.py)
      manifest.json                    written last (utils.checkpoint)

The protocol: rank 0 creates the temp dir; barrier; every rank writes its files; barrier;
rank 0 seals it (manifest, rename) only if every file above is there for every rank (the
manifest's `required` list, which verification checks); barrier, so no rank runs ahead and
e.g. exits while the checkpoint is still a temp dir. Each barrier is a vote
(`writing_together`): when a write fails on one rank, every rank stops with an error instead of
waiting for it. Everything is loaded with `weights_only=True`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from dataset.data_config import DataFormatMismatch
from dataset.train_data import TrainData
from model.lora import LoraConfig
from model.lora_checkpoint import ADAPTERS_FILE, LORA_FILE, save_lora_checkpoint
from model.modeling_z2all import CONFIG_FILE, WEIGHTS_FILE
from optimizer import TrainingOptimizer
from trainer.distributed_env import DistributedEnv, writing_together
from trainer.rng_state import capture_rng_state, restore_rng_state, seed_everything
from utils.atomic_io import atomic_open
from utils.checkpoint import (
    TRAINER_STATE,
    begin_checkpoint,
    finish_checkpoint,
    list_checkpoints,
    load_torch,
    step_dir_name,
    tmp_checkpoint_dir,
)
from utils.cli_errors import disk_full_explained

RANKS_DIR = "ranks"
OPTIM_DIR = "optim"
TRAINER_STATE_FORMAT = "z2all-trainer-state"
# (the saved trainer state) -> the ranks whose data states differ (default: every rank)
DataRanks = Callable[[dict[str, Any]], Iterable[int]]
# Every optimizer layout (ZeRO-0's optimizer.pt, ZeRO-1/2/3's and a grid's shard files, the
# overlapped optimizer's per-bucket file) reads every other by whole-model parameter name
# (optimizer/distributed_optimizer/zero1_checkpoint.py), so a resume may switch between them.


def _rank_file(ckpt_dir: Path, rank: int) -> Path:
    return ckpt_dir / RANKS_DIR / f"rank_{rank:05d}.pt"


def required_files(optimizer: TrainingOptimizer, world_size: int, lora: bool = False
                   ) -> list[str]:
    """Every file `restore_training_checkpoint` (and `load_model`) reads, for all ranks."""
    ranks = [_rank_file(Path(), rank).as_posix() for rank in range(world_size)]
    optim = [f"{OPTIM_DIR}/{name}" for name in optimizer.checkpoint_files()]
    model_files = [LORA_FILE, ADAPTERS_FILE] if lora else [CONFIG_FILE, WEIGHTS_FILE]
    return [*model_files, TRAINER_STATE, *optim, *ranks]


def _save_torch(obj: Any, path: Path) -> None:
    """`torch.save` into an atomic file. A full disk surfaces from torch's C++ writer as a
    RuntimeError ("unexpected pos ...") whose context is the failed write's OSError(ENOSPC);
    it is raised as that OSError, so the caller's disk-full message names the checkpoint."""
    with atomic_open(path, "wb") as handle:
        try:
            torch.save(obj, handle)
        except RuntimeError as error:
            if not _caused_by_full_disk(error):
                raise
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from error


def _caused_by_full_disk(error: BaseException) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        error = error.__cause__ or error.__context__
    return False


def save_training_checkpoint(env: DistributedEnv, ckpt_root: Path, step: int, *,
                             model: torch.nn.Module, optimizer: TrainingOptimizer,
                             trainer_state: dict[str, Any],
                             comm_hook_state: dict[str, Any] | None, keep_last: int,
                             val_loss: float | None, data_state: dict[str, Any],
                             lora: tuple[LoraConfig, dict[str, str]] | None = None) -> Path:
    """Collective: every rank must call it at the same step. Returns the checkpoint dir.
    `lora`: (the adapters' config, the base reference) of a LoRA run, which saves only those.

    A full disk ends the run with a `DiskFullError` that names the checkpoint being written and
    the newest earlier one, which the temp-dir-then-rename protocol leaves untouched."""
    required = required_files(optimizer, env.world_size, lora=lora is not None)  # for sealing
    previous = list_checkpoints(ckpt_root)
    intact = (f"the previous checkpoint {previous[-1][1]} is intact" if previous
              else "no earlier checkpoint exists")
    tmp_dir = tmp_checkpoint_dir(ckpt_root, step)
    what = f"writing checkpoint {tmp_dir}"
    with disk_full_explained(tmp_dir, intact):
        with writing_together(env, what):  # each phase ends when every rank is through it
            if env.is_main:
                begin_checkpoint(ckpt_root, step)
        with writing_together(env, what):
            optimizer.save_checkpoint(tmp_dir / OPTIM_DIR)
            _save_torch({"rng": capture_rng_state(), "comm_hook": comm_hook_state,
                         "data": data_state}, _rank_file(tmp_dir, env.rank))
            if env.is_main:
                if lora is not None:
                    save_lora_checkpoint(model, *lora, tmp_dir)
                else:
                    model.save_pretrained(tmp_dir)
                _save_torch({"format": TRAINER_STATE_FORMAT, "version": 1, **trainer_state,
                             "world_size": env.world_size}, tmp_dir / TRAINER_STATE)
        with writing_together(env, what):
            if env.is_main:
                finish_checkpoint(tmp_dir, step, keep_last=keep_last, val_loss=val_loss,
                                  required=required)
    return ckpt_root / step_dir_name(step)


def _load_trainer_state(ckpt_dir: Path) -> dict[str, Any]:
    state = load_torch(ckpt_dir / TRAINER_STATE)
    if state.get("format") != TRAINER_STATE_FORMAT or state.get("version") != 1:
        raise ValueError(f"{ckpt_dir / TRAINER_STATE}: not a z2all trainer state (v1)")
    return state


def restore_training_checkpoint(ckpt_dir: Path, env: DistributedEnv, *,
                                optimizer: TrainingOptimizer, data: TrainData,
                                comm_hook_state: Any, seed: int,
                                data_ranks: DataRanks | None = None) -> dict[str, Any]:
    """The twin of `save_training_checkpoint`: put the optimizer, the training data's
    position, this rank's RNG streams and comm-hook state back; return the trainer state
    (step, tokens_seen, ...). `data_ranks(saved trainer state)`: the ranks whose data states
    are distinct (on a tensor/pipeline grid one per data-parallel replica; default all).

    With another world size than the saved one, the per-rank files do not map onto the new
    ranks: RNG streams are reseeded and the comm hook starts fresh, so the run continues
    correctly but is no longer bitwise identical to an uninterrupted one."""
    state = _load_trainer_state(ckpt_dir)
    optimizer.load_checkpoint(ckpt_dir / OPTIM_DIR)
    saved_world_size = state["world_size"]
    data_states = [load_torch(_rank_file(ckpt_dir, rank)).get("data")  # one per data replica
                   for rank in (data_ranks(state) if data_ranks else range(saved_world_size))]
    try:
        note = data.restore(data_states)
    except DataFormatMismatch as error:  # every older checkpoint of the run would fail alike
        raise SystemExit(f"error: --resume: {ckpt_dir} {error}") from None
    if note and env.is_main:
        print(note, flush=True)
    if saved_world_size != env.world_size:
        print(f"rank {env.rank}: world size changed ({saved_world_size} -> "
              f"{env.world_size}); RNG and comm-hook state restart", flush=True)
        seed_everything(seed + env.rank + state["step"])
        return state
    rank_state = load_torch(_rank_file(ckpt_dir, env.rank))
    restore_rng_state(rank_state["rng"])
    # None when the run began with another --comm_hook: the hook then starts fresh.
    if comm_hook_state is not None and rank_state["comm_hook"] is not None:
        # RNG states stay CPU byte tensors (what torch's setters take); the hook's tensors
        # (PowerSGD's error feedback and Q) go back to the device the gradients live on.
        comm_hook_state.load_state_dict(_to_device(rank_state["comm_hook"], env.device))
    return state


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {key: _to_device(item, device) for key, item in value.items()}
    return value
