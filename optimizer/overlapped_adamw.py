"""Overlap the optimizer step with backward: update each bucket as soon as it is reduced.

Plain data parallelism runs: backward (bucket reductions start along the way) -> wait for all
buckets -> optimizer step over all parameters. Here each bucket's AdamW step starts as soon as
its reduction is finished. How that is known depends on the device.

On CPU (gloo) the hook polls (`is_completed()`, which never blocks) every time DDP launches
another bucket, i.e. while backward is still producing the gradients of the earlier layers:

    backward ... bucket 0 ready -> launch 0
             ... bucket 1 ready -> poll: 0 reduced? AdamW on bucket 0 -> launch 1
             ... bucket 2 ready -> poll: 1 reduced? AdamW on bucket 1 -> launch 2
    finish_grad_sync(): wait for what is left, AdamW on it

The collective runs on gloo's thread while backward computes, and the update runs on the
autograd thread between two backward nodes.

On CUDA polling would not work: the host runs ahead of the GPU, so when it asks, NCCL has
hardly started and nearly every bucket would step in finish_grad_sync (correct, no overlap).
Instead the hook queues each bucket's step at once, on a side stream, behind its reduction:

    compute stream:  backward ... (grads of bucket 0) ... backward ... (wait: stepped 0, 1, ...)
    NCCL stream:                  all-reduce 0 ...........  all-reduce 1
    side stream:                        (wait: reduced 0) AdamW 0      (wait: reduced 1) AdamW 1

Every wait is an event wait between streams (`Work.wait()` of an NCCL collective makes the
current stream wait, not the host); the host never blocks. The collective was queued behind
everything the compute stream had queued when the bucket's gradients were complete, so the
step also comes after every backward kernel that reads the bucket's parameters. Before
anything reads the parameters again, finish_grad_sync (each bucket's handle) makes the compute
stream wait for the bucket's "stepped" event.

Stepping a bucket during backward is safe: its gradients are complete, so every backward node
that reads its parameters has already run (a tied weight's gradient is complete only after its
last use). The result is bitwise the same as stepping after backward: each bucket has its own
AdamW, so the order of the updates does not matter. With `overlap_grad_reduce` off every bucket
is launched after backward, so the steps can only interleave with the later buckets'
communication.

The price: each bucket is updated before the others are even reduced, so nothing that needs
*all* gradients first is possible. Hence refused, with a clear error:
- gradient clipping (scale every gradient by max_norm / global_norm: the global norm needs
  every bucket), and
- fp16 loss scaling (a step is skipped when *any* gradient overflows; bucket 0 would already
  be updated when an inf shows up in bucket 5).
For the same reason a bf16/fp32 step with an inf/NaN gradient is not skipped here (the other
optimizers skip it): the buckets reduced before it are already updated.
`step()` still reports the global gradient norm, computed after the updates, for logging.

Usage (the object behaves like every optimizer of optimizer.get_optimizer):

    optimizer = OverlappedAdamW(ddp_model, lr=3e-4, weight_decay=0.1)
    ...backward (steps buckets as they arrive)...; ddp_model.finish_grad_sync()  # the rest
    stepped, grad_norm = optimizer.step()          # finishes anything left, reports the norm
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from optimizer.adamw import (
    adam_state_dict,
    build_adamw,
    load_adam_state_dict,
    weight_decay_groups,
)
from optimizer.distributed_optimizer.zero1_checkpoint import grouped_order, load_resharded_state
from optimizer.optimizer_config import OptimizerConfig
from optimizer.state_header import (
    OVERLAPPED_CHECKPOINT_FILE,
    OVERLAPPED_FORMAT,
    OVERLAPPED_VERSION,
)
from parallel.distributed_data_parallel import DistributedDataParallel
from parallel.distributed_data_parallel.ddp_comm_hooks.default_hooks import (
    CommHandle,
    CommHook,
    allreduce_hook,
)
from parallel.distributed_data_parallel.param_and_grad_buffer import Bucket
from parallel.side_stream import SideStream
from utils.atomic_io import atomic_open


class OverlappedAdamW:
    """AdamW (decoupled weight decay, Loshchilov & Hutter 2019) stepping bucket by bucket.

    One AdamW per bucket (`optimizer.adamw.build_adamw`: fused on CUDA), with the same two
    parameter groups as every other optimizer (`weight_decay_groups`: no decay for ndim < 2).
    bf16 parameters get fp32 master copies: AdamW updates the copy, the bf16 parameter
    receives the rounded result.
    """

    def __init__(self, ddp_model: DistributedDataParallel, lr: float, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 clip_grad: float = 0.0, params_dtype: str = "fp32",
                 reduce_hook: CommHook = allreduce_hook) -> None:
        if clip_grad > 0:
            raise ValueError(
                f"overlap_optim_step cannot clip gradients (clip_grad={clip_grad}): clipping "
                f"scales by the global norm over all buckets, but this mode updates each bucket "
                f"as soon as it is reduced, before the others arrive. Set clip_grad=0 or use the "
                f"regular optimizer.")
        if params_dtype == "fp16":
            raise ValueError(
                "overlap_optim_step does not support fp16: fp16 loss scaling must skip the whole "
                "step when any gradient overflows, which is known only after every bucket is "
                "reduced, and earlier buckets would already be updated. Use bf16 or fp32.")
        if ddp_model.config.use_distributed_optimizer:
            raise ValueError("overlap_optim_step needs full gradients on every rank (all-reduce);"
                             " ZeRO-1 (use_distributed_optimizer) has its own optimizer")
        self.ddp_model = ddp_model
        self.reduce_hook = reduce_hook
        self.buckets: list[Bucket] = [bucket for buffer in ddp_model.param_and_grad_buffers
                                      for bucket in buffer.buckets]
        self.master_params: dict[torch.nn.Parameter, Tensor] = {}
        self.bucket_optimizers: list[torch.optim.Optimizer] = []
        adamw_config = OptimizerConfig(lr=lr, weight_decay=weight_decay, adam_beta1=betas[0],
                                       adam_beta2=betas[1], adam_eps=eps, clip_grad=0.0)
        for bucket in self.buckets:
            masters = [self._master(param) for param in bucket.params]
            groups = weight_decay_groups(list(zip(bucket.params, masters)), weight_decay)
            self.bucket_optimizers.append(build_adamw(groups, adamw_config))
        self._buckets_stepped = 0
        self._in_flight: list[CommHandle] = []  # launched, not yet stepped (CPU)
        self.side_stream = SideStream()
        """Where the bucket steps are queued on CUDA (parallel/side_stream.py)."""
        ddp_model.register_comm_hook(self, overlap_optim_step_hook)

    @classmethod
    def from_config(cls, config: OptimizerConfig, ddp_model: DistributedDataParallel
                    ) -> OverlappedAdamW:
        """Build from an optimizer.optimizer_config.OptimizerConfig (read by attribute name)."""
        return cls(ddp_model, lr=config.lr, weight_decay=config.weight_decay,
                   betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps,
                   clip_grad=config.clip_grad, params_dtype=config.params_dtype)

    def _master(self, param: torch.nn.Parameter) -> Tensor:
        """The fp32 tensor AdamW updates: the parameter itself, or an fp32 copy of it."""
        master = param if param.dtype == torch.float32 else param.detach().float()
        self.master_params[param] = master
        return master

    # ---- called by the comm hook ---------------------------------------------------------

    def queue_bucket_step(self, bucket: Bucket, reduction: Any,
                          stream: Any) -> CommHandle:
        """CUDA: queue the bucket's AdamW on `stream` behind its reduction, without waiting;
        the returned handle's wait() makes the compute stream wait until it has stepped."""
        with torch.cuda.stream(stream):
            reduction.wait()  # the side stream (current here) waits for the collective
            self.step_bucket(bucket)
        stepped = torch.cuda.Event()
        stepped.record(stream)
        return CommHandle([ComputeStreamWaits(stepped, keep_alive=reduction)],
                          getattr(reduction, "bytes_sent", 0))

    def step_reduced_buckets(self) -> None:
        """Step every launched bucket whose reduction has finished; never blocks."""
        for handle in [h for h in self._in_flight if h.is_completed()]:
            handle.wait()  # returns at once; runs step_bucket
        self._in_flight = [h for h in self._in_flight if not h.is_completed()]

    @torch.no_grad()
    def step_bucket(self, bucket: Bucket) -> None:
        """AdamW on one reduced bucket (its `main_grad`s hold the rank average)."""
        for param in bucket.params:
            master, grad = self.master_params[param], param.main_grad
            # bf16 grads (grad_reduce_in_fp32=False) need an fp32 copy for the fp32 master.
            master.grad = grad if grad.dtype == master.dtype else grad.float()
        self.bucket_optimizers[bucket.global_index].step()
        for param in bucket.params:
            master = self.master_params[param]
            master.grad = None
            if master is not param:
                param.copy_(master)
        self._buckets_stepped += 1

    # ---- the optimizer interface ---------------------------------------------------------

    def step(self) -> tuple[bool, float]:
        """Finish the step (reduce + update what is left); return (True, global grad norm)."""
        if self._buckets_stepped < len(self.buckets):
            self.ddp_model.finish_grad_sync()
        stream = self.side_stream.stream
        if stream is not None:  # the norm below must see every queued step's effects
            torch.cuda.current_stream(stream.device).wait_stream(stream)
        assert self._buckets_stepped == len(self.buckets), "every bucket steps once per step"
        self._buckets_stepped = 0
        self._in_flight = []
        squares = sum(torch.linalg.vector_norm(buffer.grad_data, dtype=torch.float32) ** 2
                      for buffer in self.ddp_model.param_and_grad_buffers)
        return True, float(squares) ** 0.5

    def zero_grad(self) -> None:
        self.ddp_model.zero_grad_buffer()
        self._in_flight = []

    def finish_param_sync(self) -> None:
        """Nothing to wait for: each bucket's params were updated in place when it stepped."""

    def scale_loss(self, loss: Tensor) -> Tensor:
        return loss  # no loss scaling: fp16 is refused

    def set_lr(self, lr: float) -> None:
        for optimizer in self.bucket_optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr

    def get_lr(self) -> float:
        return self.bucket_optimizers[0].param_groups[0]["lr"]

    def state_bytes(self) -> int:
        """Bytes of optimizer state held on top of the model: Adam's moments and fp32 copies
        (as `MixedPrecisionOptimizer.state_bytes`, for the trainer's memory record)."""
        tensors = [value for optimizer in self.bucket_optimizers
                   for state in optimizer.state.values() for value in state.values()
                   if isinstance(value, Tensor)]
        tensors += [master for param, master in self.master_params.items() if master is not param]
        return sum(t.numel() * t.element_size() for t in tensors)

    def _layout(self) -> list[list[str]]:
        names = self.ddp_model.param_names
        return [[names.get(param, "?") for param in bucket.params] for bucket in self.buckets]

    def state_dict(self) -> dict[str, Any]:
        return {"format": OVERLAPPED_FORMAT, "version": OVERLAPPED_VERSION,
                "layout": self._layout(),
                "bucket_optimizers": [adam_state_dict(opt) for opt in self.bucket_optimizers],
                "master_params": [self.master_params[p].detach().clone()
                                  for bucket in self.buckets for p in bucket.params
                                  if self.master_params[p] is not p]}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state.get("format"), state.get("version")) != (OVERLAPPED_FORMAT, OVERLAPPED_VERSION):
            raise ValueError(f"not a {OVERLAPPED_FORMAT} v{OVERLAPPED_VERSION} state: "
                             f"{state.get('format')!r} v{state.get('version')!r}")
        if state["layout"] != self._layout():
            raise ValueError("optimizer state was saved with a different bucket layout (model "
                             "or bucket_size changed); it cannot be mapped onto this one")
        for optimizer, optimizer_state in zip(self.bucket_optimizers, state["bucket_optimizers"]):
            load_adam_state_dict(optimizer, optimizer_state)
        copies = [self.master_params[p] for bucket in self.buckets for p in bucket.params
                  if self.master_params[p] is not p]
        for master, saved in zip(copies, state["master_params"], strict=True):
            master.copy_(saved)

    def save_checkpoint(self, optim_dir: str | os.PathLike) -> None:
        """The state is identical on every rank: rank 0 writes one file, atomically."""
        if dist.get_rank() == 0:
            Path(optim_dir).mkdir(parents=True, exist_ok=True)
            with atomic_open(Path(optim_dir) / OVERLAPPED_CHECKPOINT_FILE, "wb") as file:
                torch.save(self.state_dict(), file)

    def checkpoint_files(self) -> list[str]:
        return [OVERLAPPED_CHECKPOINT_FILE]

    def load_checkpoint(self, optim_dir: str | os.PathLike) -> None:
        """This layout's file, or another layout's Adam state by name (ZeRO-0/1/2/3, a grid)."""
        path = Path(optim_dir) / OVERLAPPED_CHECKPOINT_FILE
        if path.is_file():
            self.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        else:
            self.load_state_dict(self._state_from_pieces(Path(optim_dir)))

    def _state_from_pieces(self, optim_dir: Path) -> dict[str, Any]:
        """The state this optimizer would have saved, from a save of pieces by name: each
        tensor gathered whole (the re-cutting loader at world size 1), each bucket's Adam state
        in its AdamW's order (`grouped_order`). Master copies the save lacks (an fp32 run's)
        stay as built from the loaded weights."""
        shapes = {name: list(param.shape) for param, name in self.ddp_model.param_names.items()}
        layout = self._layout()
        in_buckets = [name for bucket in layout for name in bucket]
        whole = load_resharded_state(optim_dir, [(name, 0, math.prod(shapes[name]))
                                                 for name in in_buckets],
                                     shapes, rank=0, world_size=1, trainable=in_buckets)
        pieces = {piece["name"]: piece for piece in whole["pieces"]}

        def adam(names: list[str]) -> dict[str, Any]:
            return {"lr": whole["lr"], "step": [pieces[name]["step"] for name in names],
                    **{key: [pieces[name][key].view(shapes[name]) for name in names]
                       for key in ("exp_avg", "exp_avg_sq")}}

        masters = [(self.master_params[param] if pieces[name]["main_param"] is None
                    else pieces[name]["main_param"].view(shapes[name]))
                   for bucket, names in zip(self.buckets, layout)
                   for param, name in zip(bucket.params, names)
                   if self.master_params[param] is not param]
        return {"format": OVERLAPPED_FORMAT, "version": OVERLAPPED_VERSION, "layout": layout,
                "bucket_optimizers": [adam(grouped_order(names, shapes)) for names in layout],
                "master_params": masters}


class ComputeStreamWaits:
    """A Waitable whose wait() makes the current CUDA stream wait for `event` (host: no wait).
    It holds `keep_alive` (the reduction and its buffers, e.g. a bf16 copy of the bucket, which
    the side stream reads) until then: freed earlier, the compute stream's allocator could hand
    that memory out while the side stream still reads it."""

    def __init__(self, event: Any, keep_alive: Any = None) -> None:
        self.event, self.keep_alive = event, keep_alive

    def wait(self) -> None:
        torch.cuda.current_stream().wait_event(self.event)


def overlap_optim_step_hook(optimizer: OverlappedAdamW, bucket: Bucket) -> CommHandle:
    """Start reducing `bucket`. CUDA: queue its update behind the reduction on the side stream.
    CPU: first step the earlier buckets reduced by now; this one's update runs at a later poll
    or when DDP waits for it."""
    stream = optimizer.side_stream.on(bucket.grad_data.device)
    if stream is None:
        optimizer.step_reduced_buckets()
    reduction = optimizer.reduce_hook(optimizer.ddp_model.process_group, bucket)
    if stream is not None:
        return optimizer.queue_bucket_step(bucket, reduction, stream)
    handle = CommHandle([reduction], getattr(reduction, "bytes_sent", 0),
                        on_complete=lambda: optimizer.step_bucket(bucket))
    optimizer._in_flight.append(handle)
    return handle
