"""The optimizer of a tensor/pipeline grid (trainer/model_parallel.py): the data-parallel one,
with clipping by the norm of the *whole* model and layout-neutral checkpoints.

    grad norm         ||g||^2 summed over the TP and PP groups: TP-split tensors add their
                      shards, replicated ones (norm weights) count once (1/T from each of T
                      ranks), the tied embedding's second copy (last stage) not at all; with
                      ZeRO-1/2/3 also over the dp x cp group, which the state is sharded over
                      (each rank holds its shard's)
    optimizer state   gathered whole into one ZeRO-1 shard file, loaded on any grid (any
                      --zero_stage), or by a data-parallel run of any size and --zero_stage,
                      and the other way (trainer/grid_optimizer_checkpoint.py)
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.distributed as dist

from model.lora import lora_config_of
from model.modeling_z2all import Z2allForCausalLM
from optimizer.clip_grads import clip_grads_
from optimizer.optimizer import MixedPrecisionOptimizer
from parallel.parallel_dims import ParallelDims
from parallel_plan.llama_pipeline import tied_embedding_param
from parallel_plan.llama_tensor_parallel import layout_for
from trainer.grid_optimizer_checkpoint import (
    GRID_OPTIMIZER_FILES,
    NamedPieces,
    load_grid_optimizer,
    save_grid_optimizer,
)

TIED_EMBEDDING = "model.embed_tokens.weight"


class GridOptimizer:
    """The data-parallel optimizer (replicated, or sharded over the dp x cp group: ZeRO-1/2/3)
    with whole-model clipping and layout-neutral checkpoints (module docstring): a
    `TrainingOptimizer` (optimizer/factory.py) whose other calls go to the inner one."""

    def __init__(self, inner: MixedPrecisionOptimizer, model: Z2allForCausalLM,
                 dims: ParallelDims, max_norm: float) -> None:
        self.inner, self.model, self.dims, self.max_norm = inner, model, dims, max_norm
        # The last stage's copy of a tied embedding (the first stage counts the original).
        self._tied_copy = (tied_embedding_param(model, dims)
                           if dims.is_last_stage and not dims.is_first_stage else None)
        self._norm_weight = {  # each element of the whole model counted once
            param: 0.0 if param is self._tied_copy
            else 1.0 if dims.tensor_parallel > 1 and layout_for(name, model.config)
            else 1.0 / dims.tensor_parallel
            for name, param in model.named_parameters()}

    def set_lr(self, lr: float) -> None:
        self.inner.set_lr(lr)

    def zero_grad(self) -> None:
        self.inner.zero_grad()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.inner.scale_loss(loss)

    def finish_param_sync(self) -> None:
        self.inner.finish_param_sync()

    def state_bytes(self) -> int:
        return self.inner.state_bytes()

    def _owned_grads(self) -> list[torch.Tensor]:
        """The averaged gradient (after finish_grad_sync) of each piece this rank updates:
        whole `main_grad`s, or under ZeRO-1/2/3 the parts in this rank's shard (only those
        were reduce-scattered to it)."""
        return [piece.grad for piece in self.inner.main_pieces()]

    def grad_norm(self) -> float:
        """||g|| of the whole model: this rank's owned gradients, squared and weighted, summed
        over the TP and PP groups (and over the dp x cp group when ZeRO shards them over it;
        without ZeRO the cp ranks hold the same averaged gradients, counted once)."""
        pieces = self.inner.main_pieces()
        norms = torch.stack(torch._foreach_norm([piece.grad for piece in pieces], 2.0)).double()
        weights = torch.tensor([self._norm_weight[piece.param] for piece in pieces],
                               dtype=torch.float64, device=norms.device)
        squares = (norms.square() * weights).sum()
        groups = [self.dims.tp_group, self.dims.pp_group]
        if self.inner.grads_sharded:
            groups.append(self.dims.dp_cp_group)
        for group in groups:
            dist.all_reduce(squares, group=group)
        return float(squares.sqrt())

    def step(self) -> tuple[bool, float]:
        """Clip by the whole model's norm, then the inner step (built with clip_grad=0)."""
        grad_norm = self.grad_norm()
        if not math.isfinite(grad_norm):
            return False, grad_norm
        if self.max_norm > 0:
            clip_grads_(self._owned_grads(), self.max_norm, grad_norm)
        stepped, _ = self.inner.step()
        return stepped, grad_norm

    # ---- checkpoints: layout-neutral, in ZeRO-1's shard-file format (module docstring) --------
    def _named_pieces(self) -> NamedPieces:
        """{whole-model name: (this rank's trainable parameter, its pieces this rank
        updates)}; a frozen one (a LoRA base's) has no optimizer state. The last stage's copy
        of a tied embedding goes by the embedding's name: its state is the same, saved once."""
        named = {param: (TIED_EMBEDDING if param is self._tied_copy else name, [])
                 for name, param in self.model.named_parameters() if param.requires_grad}
        for piece in self.inner.main_pieces():
            named[piece.param][1].append(piece)
        return {name: (param, pieces) for param, (name, pieces) in named.items()}

    def save_checkpoint(self, optim_dir: str | Path) -> None:
        save_grid_optimizer(self.inner, self._named_pieces(), self.model.config, self.dims,
                            Path(optim_dir), lora=lora_config_of(self.model))

    def checkpoint_files(self) -> list[str]:
        return GRID_OPTIMIZER_FILES

    def load_checkpoint(self, optim_dir: str | Path) -> None:
        load_grid_optimizer(self.inner, self._named_pieces(), self.model.config, self.dims,
                            Path(optim_dir), lora=lora_config_of(self.model))
