"""Layout-neutral checkpoints move between grids: a TP2 x PP2 run's save is the whole model
and Adam state of the single-process run (2x2 -> 1), written in the ZeRO-1 piece format it
re-cuts for another world size, and a single-process save resumed on TP=2 continues exactly
like the single process (1 -> TP=2)."""

from __future__ import annotations

from pathlib import Path

import torch

from optimizer.distributed_optimizer.zero1_checkpoint import (
    SHARD_FORMAT,
    load_resharded_state,
    shard_file_name,
)
from optimizer.state_header import STATE_VERSION
from parallel.local_ranks import run_on_ranks
from tests.model.model_helpers import small_model
from tests.parallel.grid_helpers import train_on_grid, train_single_process


def _to_numpy(tree):
    """Tensors as numpy arrays: they cross process boundaries by value."""
    if isinstance(tree, dict):
        return {key: _to_numpy(value) for key, value in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_to_numpy(value) for value in tree)
    return tree.numpy() if isinstance(tree, torch.Tensor) else tree


def _to_torch(tree):
    if isinstance(tree, dict):
        return {key: _to_torch(value) for key, value in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_to_torch(value) for value in tree)
    return torch.from_numpy(tree)


def _save_on_2x2(rank: int, world_size: int):
    _, state, moments = train_on_grid(4, 2, 2, True, "1f1b", 2, steps=range(2))
    return _to_numpy((state, moments)) if state is not None else None


def _resume_on_tp2(rank: int, world_size: int, saved):
    losses, state, _ = train_on_grid(2, 2, 1, False, "1f1b", 2, steps=range(2, 3),
                                     resume_from=_to_torch(saved))
    return losses, state and _to_numpy(state)


def _reload_through_zero1_format(state: dict, moments: dict, optim_dir: Path) -> None:
    """Whole tensors written as ZeRO-1 pieces covering [0, numel) of each parameter (one file,
    world size 1) load into another cut: here 2 ranks, each taking half of every parameter."""
    names = list(moments["exp_avg"])
    param_shapes = {name: list(state[name].shape) for name in names}
    pieces = [{"name": name, "start": 0, "end": state[name].numel(), "step": 2,
               "main_param": state[name].flatten(), "exp_avg": moments["exp_avg"][name].flatten(),
               "exp_avg_sq": moments["exp_avg_sq"][name].flatten()} for name in names]
    torch.save({"format": SHARD_FORMAT, "version": STATE_VERSION, "kind": "DistributedOptimizer",
                "world_size": 1, "rank": 0, "lr": 1e-2, "grad_scaler": None,
                "param_shapes": param_shapes, "pieces": pieces},
               optim_dir / shard_file_name(0, 1))
    for rank in range(2):
        halves = [(name, rank * (size := state[name].numel()) // 2, (rank + 1) * size // 2)
                  for name in names]
        loaded = load_resharded_state(optim_dir, halves, param_shapes, rank, 2, names)
        for (name, start, end), piece in zip(halves, loaded["pieces"]):
            assert piece["step"] == 2
            assert torch.equal(piece["exp_avg"], moments["exp_avg"][name].flatten()[start:end])
            assert torch.equal(piece["main_param"], state[name].flatten()[start:end])


def test_2x2_save_is_the_single_process_state(tmp_path):
    saved_state, saved_moments = _to_torch(run_on_ranks(_save_on_2x2, world_size=4,
                                                        timeout=600)[0])
    _reload_through_zero1_format(saved_state, saved_moments, tmp_path)
    _, ref_state, ref_moments = train_single_process(1, 2, steps=2)
    small_model("gqa").load_state_dict(saved_state, strict=True)  # names and shapes whole
    for name, value in ref_state.items():
        torch.testing.assert_close(saved_state[name], value, rtol=1e-4, atol=1e-5, msg=name)
    for key, by_name in ref_moments.items():
        for name, value in by_name.items():
            torch.testing.assert_close(saved_moments[key][name], value, rtol=1e-4, atol=1e-7,
                                       msg=f"{key} of {name}")


def test_single_process_save_resumes_on_tp2():
    _, state_after_2, moments_after_2 = train_single_process(1, 2, steps=2)
    ref_losses, ref_state, _ = train_single_process(1, 2, steps=3)
    results = run_on_ranks(_resume_on_tp2, (_to_numpy(state_after_2), _to_numpy(moments_after_2)),
                           world_size=2, timeout=600)
    losses, state = results[0][0], _to_torch(results[0][1])
    torch.testing.assert_close(losses, ref_losses[2:], rtol=1e-5, atol=1e-6)
    for name, value in ref_state.items():
        torch.testing.assert_close(state[name], value, rtol=1e-4, atol=1e-5, msg=name)
