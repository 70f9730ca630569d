"""The optimizer state of a tensor/pipeline grid, saved so that any other grid can resume it.

Each rank's AdamW holds state only for its slices of its stage's parameters. Saving
(collective, every rank calls it):

    Step 1  per parameter, the fp32 tensor AdamW updates (the weight itself in fp32, its main
            copy in bf16) and its two moments, under the whole model's parameter names;
    Step 2  each of the three gathered whole on global rank 0 (gather_full_tensors: unsplit
            over the TP group, stages merged over the PP group);
    Step 3  rank 0 writes them as a ZeRO-1 shard file of a one-rank run
            (optimizer/distributed_optimizer/zero1_checkpoint.py), one piece per parameter
            covering all its elements: `optim/zero1_rank00000_of00001.pt`.

Loading reads, for every parameter of this rank's stage, the whole tensors by name from the
shard files (`load_resharded_state`: a grid's single file, or a ZeRO-1 data-parallel run's
files of any world size) and keeps this rank's slice (shard_full_tensors). Worked example:
TP=2 saved `qkv_proj.weight`'s moments as rows q0..q3 | k0 k1 | v0 v1 (whole); a PP=2 run
gives them whole to the stage holding that layer, a TP=2 run gives rank 1 q2 q3 | k1 | v1.

The same file is what a data-parallel run with --zero_stage=1 reads, so a grid run can also
continue in one process (and a ZeRO-1 run on a grid). Tensors are copied, never recomputed:
a resume on the same grid is bitwise identical to an uninterrupted run.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from model.configuration_z2all import Z2allConfig
from model.modeling_z2all import Z2allForCausalLM
from optimizer.adamw import read_adam_state, write_adam_state
from optimizer.distributed_optimizer.zero1_checkpoint import (
    SHARD_FORMAT,
    TENSOR_KEYS,
    load_resharded_state,
    shard_file_name,
)
from optimizer.optimizer import STATE_VERSION, MixedPrecisionOptimizer
from parallel.layout_neutral_checkpoint import gather_full_tensors, shard_full_tensors
from parallel.parallel_dims import ParallelDims
from utils.atomic_io import atomic_open

GRID_OPTIMIZER_FILES = [shard_file_name(0, 1)]
# {whole-model parameter name: (this rank's parameter, the fp32 tensor AdamW updates)}
ParamsAndMains = dict[str, tuple[torch.Tensor, torch.Tensor]]


def save_grid_optimizer(optimizer: MixedPrecisionOptimizer, params: ParamsAndMains,
                        config: Z2allConfig, dims: ParallelDims, optim_dir: Path) -> None:
    """Collective: the module docstring's steps 1-3 (only rank 0 writes)."""
    # Step 1: this rank's tensors by name.
    mains = {name: main for name, (_, main) in params.items()}
    moments = {name: read_adam_state(optimizer.inner, main) for name, main in mains.items()}
    local = {"main_param": mains,
             "exp_avg": {name: moment[0] for name, moment in moments.items()},
             "exp_avg_sq": {name: moment[1] for name, moment in moments.items()}}
    # Step 2: whole on rank 0.
    full = {key: gather_full_tensors(tensors, config, dims) for key, tensors in local.items()}
    if dims.rank != 0:
        return
    # Step 3: one piece per parameter, elements [0, numel).
    step = max(step for _, _, step in moments.values())  # the same for every tensor
    scaler = optimizer.grad_scaler
    state = {"format": SHARD_FORMAT, "version": STATE_VERSION, "kind": "GridOptimizer",
             "world_size": 1, "rank": 0, "lr": optimizer.get_lr(),
             "grad_scaler": None if scaler is None else scaler.state_dict(),
             "param_shapes": {name: list(t.shape) for name, t in full["main_param"].items()},
             "pieces": [{"name": name, "start": 0, "end": tensor.numel(), "step": step,
                         **{key: full[key][name].float().cpu().flatten() for key in TENSOR_KEYS}}
                        for name, tensor in full["main_param"].items()]}
    with atomic_open(optim_dir / GRID_OPTIMIZER_FILES[0], "wb") as handle:
        torch.save(state, handle)


def load_grid_optimizer(optimizer: MixedPrecisionOptimizer, params: ParamsAndMains,
                        config: Z2allConfig, dims: ParallelDims, optim_dir: Path) -> None:
    """This rank's slices of a save made on any grid (or by ZeRO-1 at any world size)."""
    with torch.device("meta"):
        shapes = {name: list(param.shape)
                  for name, param in Z2allForCausalLM(config).named_parameters()}
    state = load_resharded_state(optim_dir, [(name, 0, math.prod(shapes[name])) for name in params],
                                 shapes, dims.rank, dims.world_size)
    full = {key: {piece["name"]: piece[key].view(shapes[piece["name"]])
                  for piece in state["pieces"]} for key in TENSOR_KEYS}
    local = {key: shard_full_tensors(tensors, list(params), config, dims)
             for key, tensors in full.items()}
    with torch.no_grad():
        for name, (param, main) in params.items():
            main.copy_(local["main_param"][name])
            if main is not param:  # bf16 weights: the rounding of the fp32 main copy
                param.copy_(main)
            write_adam_state(optimizer.inner, main, local["exp_avg"][name],
                             local["exp_avg_sq"][name], state["pieces"][0]["step"])
    optimizer.set_lr(state["lr"])
    if optimizer.grad_scaler is not None:
        optimizer.grad_scaler.load_state_dict(state["grad_scaler"])
