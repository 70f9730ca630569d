"""ZeRO-1 (Rajbhandari et al., "ZeRO", 2020, stage 1 = optimizer-state partitioning).

Plain data parallelism keeps, on every one of W ranks, the fp32 main params and Adam's two
moments: 12 bytes per parameter for a bf16 model (4 + 4 + 4), W times over. ZeRO-1 keeps them
once in total: rank r holds them only for its shard of each DDP bucket (shard_map.py explains
the shard <-> parameter mapping). One step on rank r:

    Step 1  DDP reduce-scatters each bucket: rank r gets the averaged gradient of its shard
    Step 2  fp16: unscale + inf check, all-reduced so that every rank skips together
    Step 3  grad norm: each rank's sum of squares over its shard, all-reduced, sqrt; clip
    Step 4  AdamW updates the fp32 main params of the shard (pieces of parameters)
    Step 5  write them into the model params' shard (param buffer), all-gather every bucket

Memory per rank: model params + grads (full) + 12/W bytes per parameter of optimizer state.
Communication: reduce-scatter + all-gather move the same bytes as one all-reduce.

Overlapped param gather: Step 5's all-gathers are started asynchronously, one per bucket, and
each is waited for by a forward pre-hook of the modules that own the bucket's params, so the
next forward computes early layers while later buckets still arrive. Code that reads params
outside a forward (saving, eval by hand) calls `finish_param_sync()` first. This relies on a
contract of the model: a parameter is read only inside the forward of a module that owns it
(a parent that hands `child.weight` to a function of its own would read it unwaited). A gather
that no forward waited for is reported when the next step begins.

CPU offload (ZeRO-Offload, Ren et al. 2021): main params and Adam state of the shard live in
(pinned) CPU memory and AdamW runs there; each step copies the fp32 grad shard down and the
updated param shard back up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from optimizer.adamw import read_adam_state, write_adam_state
from optimizer.optimizer import MainPiece, MixedPrecisionOptimizer
from optimizer.optimizer_config import OptimizerConfig
from optimizer.state_header import STATE_VERSION, check_state_header
from parallel.distributed_data_parallel import DistributedDataParallel
from parallel.flat_collectives import all_gather_single
from utils.atomic_io import atomic_open

from .shard_map import ShardPiece, pieces_in_shard, shard_range
from .zero1_checkpoint import (
    SHARD_FORMAT,
    load_resharded_state,
    shard_file_name,
)

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class BucketShard:
    """This rank's shard of one DDP bucket and the fp32 tensors AdamW updates for it."""

    bucket: Any
    model_param_shard: Tensor
    """View into the model's param buffer (what the all-gather sends)."""
    model_grad_shard: Tensor
    """View into DDP's grad buffer (what the reduce-scatter produced)."""
    main_param_shard: Tensor
    """fp32; *is* model_param_shard when the model is fp32 and nothing is offloaded."""
    main_grad_shard: Tensor
    """fp32; *is* model_grad_shard when grads are reduced in fp32 and nothing is offloaded."""
    pieces: list[ShardPiece]
    main_pieces: list[Tensor]
    """`main_param_shard[piece.shard_start:piece.shard_end]` per piece: AdamW's params."""


def fp32_shard(source: Tensor, cpu_offload: bool) -> Tensor:
    """The fp32 tensor the optimizer works on for `source`: `source` itself when possible."""
    if source.dtype == torch.float32 and not cpu_offload:
        return source
    if cpu_offload:
        pinned = torch.empty(source.shape, dtype=torch.float32, device="cpu",
                             pin_memory=torch.cuda.is_available())  # pinned: faster copies
        return pinned.copy_(source)
    return source.float()  # a new fp32 copy on the same device


class DistributedOptimizer(MixedPrecisionOptimizer):
    """ZeRO-1 AdamW over a model wrapped with `use_distributed_optimizer=True` DDP."""

    def __init__(self, config: OptimizerConfig, ddp_model: DistributedDataParallel) -> None:
        if any(buffer.param_data is None for buffer in ddp_model.param_and_grad_buffers):
            raise ValueError("DistributedOptimizer needs DDP built with "
                             "use_distributed_optimizer=True (params must live in param_data)")
        group = ddp_model.process_group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.param_names: dict[nn.Parameter, str] = ddp_model.param_names
        self.bucket_shards = [self._build_bucket_shard(buffer, bucket, config.cpu_offload)
                              for buffer in ddp_model.param_and_grad_buffers
                              for bucket in buffer.buckets]
        model_and_main = [(piece.param, main) for piece, main in self._owned_pieces()]
        super().__init__(config, ddp_model, model_and_main, grads_sharded=True)
        self._pending_gathers: dict[int, Any] = {}  # bucket shard index -> async work
        self._reported_unwaited_gathers = False
        if config.overlap_param_gather:
            self._register_param_gather_waits()

    def _build_bucket_shard(self, buffer: Any, bucket: Any, cpu_offload: bool) -> BucketShard:
        start, end = shard_range(bucket, self.rank, self.world_size)
        model_param_shard = bucket.param_data[start:end]
        model_grad_shard = bucket.grad_data[start:end]
        main_param_shard = fp32_shard(model_param_shard, cpu_offload)
        pieces = pieces_in_shard(buffer, bucket, self.rank, self.world_size, self.param_names)
        return BucketShard(
            bucket=bucket, model_param_shard=model_param_shard,
            model_grad_shard=model_grad_shard, main_param_shard=main_param_shard,
            main_grad_shard=fp32_shard(model_grad_shard, cpu_offload), pieces=pieces,
            main_pieces=[main_param_shard[p.shard_start:p.shard_end] for p in pieces])

    def _owned_pieces(self) -> list[tuple[ShardPiece, Tensor]]:
        """(piece, its fp32 main tensor) over all bucket shards, in one fixed order."""
        return [(piece, main) for shard in self.bucket_shards
                for piece, main in zip(shard.pieces, shard.main_pieces)]

    def main_pieces(self) -> list[MainPiece]:
        return [MainPiece(piece.param, piece.param_start, piece.param_end, main,
                          shard.model_grad_shard[piece.shard_start:piece.shard_end])
                for shard in self.bucket_shards
                for piece, main in zip(shard.pieces, shard.main_pieces)]

    # ---- Steps 1 and 5 of the recipe in optimizer/optimizer.py ------------------------------
    def _prepare_main_grads(self) -> None:
        if self._pending_gathers and not self._reported_unwaited_gathers:
            self._report_unwaited_gathers()
        self.finish_param_sync()  # a gather still in flight must land before params change
        for shard in self.bucket_shards:
            if shard.main_grad_shard is not shard.model_grad_shard:
                shard.main_grad_shard.copy_(shard.model_grad_shard)  # cast and/or to CPU
            for piece, main in zip(shard.pieces, shard.main_pieces):
                main.grad = shard.main_grad_shard[piece.shard_start:piece.shard_end]

    def _copy_main_params_to_model_params(self) -> None:
        for shard in self.bucket_shards:
            if shard.main_param_shard is not shard.model_param_shard:
                shard.model_param_shard.copy_(shard.main_param_shard)  # cast and/or to GPU
        self._start_param_gather()
        if not self.config.overlap_param_gather:
            self.finish_param_sync()

    # ---- all-gather of the updated params --------------------------------------------------
    def _start_param_gather(self) -> None:
        """Every rank sends its updated shard and receives everyone else's, bucket by bucket.

        Reverse bucket order = forward order: DDP fills buckets from the last layer backwards,
        and collectives complete in launch order, so the bucket the next forward needs first
        (embeddings) must be launched first. Same order on every rank (matched by order)."""
        for index in reversed(range(len(self.bucket_shards))):
            shard = self.bucket_shards[index]
            self._pending_gathers[index] = all_gather_single(
                shard.bucket.param_data, shard.model_param_shard,
                group=self.process_group, async_op=True)

    def _wait_param_gather(self, indices: list[int]) -> None:
        for index in indices:
            work = self._pending_gathers.pop(index, None)
            if work is not None:
                work.wait()

    def finish_param_sync(self) -> None:
        """Wait for every outstanding param all-gather (no-op when none is in flight)."""
        self._wait_param_gather(list(self._pending_gathers))

    def _register_param_gather_waits(self) -> None:
        """A forward pre-hook on each module that owns params waits for their buckets only."""
        shard_of_param = {param: index for index, shard in enumerate(self.bucket_shards)
                          for param in shard.bucket.params}
        for module in self.ddp_model.module.modules():
            indices = sorted({shard_of_param[param] for param in module.parameters(recurse=False)
                              if param in shard_of_param})
            if indices:
                module.register_forward_pre_hook(self._make_wait_hook(indices))

    def _report_unwaited_gathers(self) -> None:
        """Once: buckets whose gather no forward pre-hook waited for since the last step. Their
        params were unused, or read outside their own module's forward, maybe half-gathered."""
        self._reported_unwaited_gathers = True
        names = [self.param_names.get(param, "?") for index in sorted(self._pending_gathers)
                 for param in self.bucket_shards[index].bucket.params]
        logger.warning("overlap_param_gather: no forward waited for the all-gather of %s since "
                       "the last step. If the model reads these outside their module's forward, "
                       "it may have used partly updated values; call them through the module.",
                       ", ".join(names[:5]) + (", ..." if len(names) > 5 else ""))

    def _make_wait_hook(self, indices: list[int]):
        def wait_before_forward(module: nn.Module, args: Any) -> None:
            self._wait_param_gather(indices)
        return wait_before_forward

    # ---- memory accounting (tests and bench/bench_optim.py) --------------------------------
    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds on top of the model: Adam moments and the
        fp32 shard copies (zero extra for a non-offloaded fp32 model, whose shard is a view)."""
        extra = [t for shard in self.bucket_shards
                 for t, model in ((shard.main_param_shard, shard.model_param_shard),
                                  (shard.main_grad_shard, shard.model_grad_shard))
                 if t is not model]
        return super().state_bytes() + sum(t.numel() * t.element_size() for t in extra)

    # ---- checkpoints: one file per rank, re-cut for any world size on load -----------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's shard: each piece addressed by parameter name and element range."""
        self.finish_param_sync()
        pieces = []
        for piece, main in self._owned_pieces():
            exp_avg, exp_avg_sq, step = read_adam_state(self.inner, main)
            pieces.append({"name": piece.name, "start": piece.param_start,
                           "end": piece.param_end, "step": step,
                           # clone: saving a view would save the whole param buffer
                           "main_param": main.detach().clone().cpu(),
                           "exp_avg": exp_avg.cpu(), "exp_avg_sq": exp_avg_sq.cpu()})
        return {"format": SHARD_FORMAT, "version": STATE_VERSION, "kind": type(self).__name__,
                "world_size": self.world_size, "rank": self.rank, "lr": self.get_lr(),
                "grad_scaler": None if self.grad_scaler is None else self.grad_scaler.state_dict(),
                "param_shapes": self._param_shapes(), "pieces": pieces}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a shard state cut for exactly this rank (load_checkpoint re-cuts others)."""
        check_state_header(state, SHARD_FORMAT, type(self).__name__)
        if (state["world_size"], state["rank"]) != (self.world_size, self.rank):
            raise ValueError(f"state is for rank {state['rank']} of {state['world_size']}, this "
                             f"is rank {self.rank} of {self.world_size}; use load_checkpoint")
        my_pieces = self._owned_pieces()
        saved_keys = [(s["name"], s["start"], s["end"]) for s in state["pieces"]]
        my_keys = [(p.name, p.param_start, p.param_end) for p, _ in my_pieces]
        if saved_keys != my_keys:
            raise ValueError("saved shard layout differs from this optimizer's (bucket_size or "
                             "model changed?); use load_checkpoint, which re-cuts by name")
        if (state["grad_scaler"] is None) != (self.grad_scaler is None):
            raise ValueError("checkpoint and config disagree on fp16 loss scaling")
        with torch.no_grad():
            for (_, main), saved in zip(my_pieces, state["pieces"]):
                if saved["main_param"] is not None:  # None: an fp32 ZeRO-0 save, main = weights
                    main.copy_(saved["main_param"])
                write_adam_state(self.inner, main, saved["exp_avg"], saved["exp_avg_sq"],
                                 saved["step"])
        self.set_lr(state["lr"])
        if self.grad_scaler is not None:
            self.grad_scaler.load_state_dict(state["grad_scaler"])
        with torch.no_grad():
            self._copy_main_params_to_model_params()
        self.finish_param_sync()

    def save_checkpoint(self, optim_dir: str | Path) -> None:
        """Every rank writes its own file (atomically); the caller barriers afterwards."""
        path = Path(optim_dir) / shard_file_name(self.rank, self.world_size)
        with atomic_open(path, "wb") as handle:
            torch.save(self.state_dict(), handle)

    def checkpoint_files(self) -> list[str]:
        """One shard file per rank."""
        return [shard_file_name(rank, self.world_size) for rank in range(self.world_size)]

    def load_checkpoint(self, optim_dir: str | Path) -> None:
        """Works whatever the world size of the run that saved, and on a ZeRO-0 run's
        `optimizer.pt` (see zero1_checkpoint.py)."""
        my_pieces = [(p.name, p.param_start, p.param_end) for p, _ in self._owned_pieces()]
        state = load_resharded_state(Path(optim_dir), my_pieces, self._param_shapes(),
                                     self.rank, self.world_size, self._trainable_names())
        # ZeRO stages 1, 2 and 3 write the same pieces (optimizer/sharded_optimizer.py): a file
        # of any of them, once re-cut for this rank, is this optimizer's state.
        state["kind"] = type(self).__name__
        self.load_state_dict(state)
