"""The optimizer state of a tensor/pipeline grid, saved so that any other grid can resume it.

Each rank's AdamW holds state only for its slices of its stage's parameters. Saving
(collective, every rank calls it):

    Step 1  per parameter, the fp32 tensor AdamW updates (the weight itself in fp32, its main
            copy in bf16) and its two moments, under the whole model's parameter names; with
            ZeRO-1/2/3 each rank of the group the state is sharded over (dp x cp: the
            data-parallel group, with context parallelism its context-parallel ranks too)
            holds pieces of them (its shard of each bucket or unit), laid into zeros and
            summed over that group: every element is held by exactly one rank, so the sum is
            each tensor whole, bit for bit;
    Step 2  each of the three gathered whole on global rank 0 (gather_full_tensors: unsplit
            over the TP group, stages merged over the PP group);
    Step 3  rank 0 writes them as a ZeRO-1 shard file of a one-rank run
            (optimizer/distributed_optimizer/zero1_checkpoint.py), one piece per parameter
            covering all its elements: `optim/zero1_rank00000_of00001.pt`.

Loading reads, for every parameter of this rank's stage, the whole tensors by name from the
shard files (`load_resharded_state`: a grid's single file, a ZeRO-1/2/3 data-parallel run's
files of any world size, or a ZeRO-0 run's `optimizer.pt`, read by name) and keeps this rank's
slice (shard_full_tensors). Worked example:
TP=2 saved `qkv_proj.weight`'s moments as rows q0..q3 | k0 k1 | v0 v1 (whole); a PP=2 run
gives them whole to the stage holding that layer, a TP=2 run gives rank 1 q2 q3 | k1 | v1; a
ZeRO-1 grid then keeps, of that slice, the elements of its pieces.

The same file is what a data-parallel run reads at any --zero_stage (ZeRO-0 gathers the
pieces whole into its own order), so a grid run can also continue in one process or with plain
DDP (and a data-parallel run of any stage on a grid). A LoRA run's frozen base has no state:
only its adapters have pieces, while `param_shapes` names the whole model, base included, as
ZeRO-1's files do. Tensors are copied, never recomputed:
a resume on the same grid is bitwise identical to an uninterrupted run.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.distributed as dist

from model.configuration_z2all import Z2allConfig
from model.lora import LoraConfig, apply_lora
from model.modeling_z2all import Z2allForCausalLM
from optimizer.adamw import read_adam_state, write_adam_state
from optimizer.distributed_optimizer.zero1_checkpoint import (
    SHARD_FORMAT,
    TENSOR_KEYS,
    load_resharded_state,
    shard_file_name,
)
from optimizer.optimizer import MainPiece, MixedPrecisionOptimizer
from optimizer.state_header import STATE_VERSION
from parallel.layout_neutral_checkpoint import gather_full_tensors, shard_full_tensors
from parallel.parallel_dims import ParallelDims
from parallel_plan.llama_tensor_parallel import layouts_of
from utils.atomic_io import atomic_open

GRID_OPTIMIZER_FILES = [shard_file_name(0, 1)]
# {whole-model parameter name: (this rank's parameter, the pieces of it this rank updates)}
NamedPieces = dict[str, tuple[torch.Tensor, list[MainPiece]]]


def whole_model_shapes(config: Z2allConfig, lora: LoraConfig | None
                       ) -> tuple[dict[str, list[int]], list[str]]:
    """({name: shape} of every parameter of the whole model, in its order (with `lora`, its
    adapters and its frozen base), the names of those with optimizer state): the
    `param_shapes` a shard file records to refuse another model, as ZeRO-1 records its
    model's, and what names a ZeRO-0 save's tensors (zero1_checkpoint.py `replicated_order`)."""
    with torch.device("meta"):
        whole = Z2allForCausalLM(config)
        if lora is not None:
            apply_lora(whole, lora)
    named = list(whole.named_parameters())
    return ({name: list(param.shape) for name, param in named},
            [name for name, param in named if param.requires_grad])


def save_grid_optimizer(optimizer: MixedPrecisionOptimizer, params: NamedPieces,
                        config: Z2allConfig, dims: ParallelDims, optim_dir: Path,
                        lora: LoraConfig | None = None) -> None:
    """Collective: the module docstring's steps 1-3 (only rank 0 writes). `params`: the
    trainable ones (with `lora`, the adapters: the frozen base has no state)."""
    local, step = _whole_on_this_rank(optimizer, params, dims)  # Step 1
    # Step 2: whole on rank 0.
    full = {key: gather_full_tensors(tensors, layouts_of(config), dims)
            for key, tensors in local.items()}
    if dims.rank != 0:
        return
    # Step 3: one piece per parameter, elements [0, numel).
    scaler = optimizer.grad_scaler
    state = {"format": SHARD_FORMAT, "version": STATE_VERSION, "kind": "GridOptimizer",
             "world_size": 1, "rank": 0, "lr": optimizer.get_lr(),
             "grad_scaler": None if scaler is None else scaler.state_dict(),
             "param_shapes": whole_model_shapes(config, lora)[0],
             "pieces": [{"name": name, "start": 0, "end": tensor.numel(), "step": step,
                         **{key: full[key][name].float().cpu().flatten() for key in TENSOR_KEYS}}
                        for name, tensor in full["main_param"].items()]}
    with atomic_open(optim_dir / GRID_OPTIMIZER_FILES[0], "wb") as handle:
        torch.save(state, handle)


def _whole_on_this_rank(optimizer: MixedPrecisionOptimizer, params: NamedPieces,
                        dims: ParallelDims) -> tuple[dict[str, dict[str, torch.Tensor]], int]:
    """Step 1: ({key of TENSOR_KEYS: {name: this rank's parameter's tensor, whole}}, Adam's
    step), from the pieces (summed over the dp x cp group when ZeRO spread them over it)."""
    local: dict[str, dict[str, torch.Tensor]] = {key: {} for key in TENSOR_KEYS}
    steps = {0}
    for name, (param, pieces) in params.items():
        whole = {key: torch.zeros(param.numel(), device=param.device) for key in TENSOR_KEYS}
        for piece in pieces:
            exp_avg, exp_avg_sq, step = read_adam_state(optimizer.inner, piece.main)
            steps.add(step)
            for key, tensor in zip(TENSOR_KEYS, (piece.main, exp_avg, exp_avg_sq)):
                whole[key][piece.start:piece.end] = tensor.reshape(-1)
        for key, tensor in whole.items():
            if optimizer.grads_sharded:
                dist.all_reduce(tensor, group=dims.dp_cp_group)
            local[key][name] = tensor.view(param.shape)
    return local, max(steps)  # the same for every tensor once stepped


def load_grid_optimizer(optimizer: MixedPrecisionOptimizer, params: NamedPieces,
                        config: Z2allConfig, dims: ParallelDims, optim_dir: Path,
                        lora: LoraConfig | None = None) -> None:
    """This rank's pieces of a save made on any grid (or by ZeRO-1 at any world size); `lora`
    as for `save_grid_optimizer`."""
    shapes, trainable = whole_model_shapes(config, lora)
    state = load_resharded_state(optim_dir, [(name, 0, math.prod(shapes[name])) for name in params],
                                 shapes, dims.rank, dims.world_size, trainable)
    # main_param None: a ZeRO-0 fp32 save, whose main params are the weights the model loaded
    keys = [key for key in TENSOR_KEYS if state["pieces"][0][key] is not None]
    full = {key: {piece["name"]: piece[key].view(shapes[piece["name"]])
                  for piece in state["pieces"]} for key in keys}
    local = {key: shard_full_tensors(tensors, list(params), layouts_of(config), dims)
             for key, tensors in full.items()}
    with torch.no_grad():
        for name, (_, pieces) in params.items():
            for piece in pieces:
                saved = {key: local[key][name].reshape(-1)[piece.start:piece.end]
                         .view_as(piece.main) for key in keys}
                if "main_param" in saved:
                    piece.main.copy_(saved["main_param"])
                write_adam_state(optimizer.inner, piece.main, saved["exp_avg"],
                                 saved["exp_avg_sq"], state["pieces"][0]["step"])
    optimizer.copy_main_params_to_model()  # bf16 weights: the rounding of the main copy
    optimizer.set_lr(state["lr"])
    if optimizer.grad_scaler is not None:
        optimizer.grad_scaler.load_state_dict(state["grad_scaler"])
