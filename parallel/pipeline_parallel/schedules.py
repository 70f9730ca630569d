"""Pipeline schedules: run forward and backward of M micro-batches through P stages.

`PipelineSchedule(stage, dims, schedule).step(micro_batches)` is what the trainer calls once
per optimizer step instead of its own micro-batch loop (`stage`: this rank's `PipelineStage`,
stage.py). It leaves the gradients of the M micro-batches summed in the parameters and returns
the sum of the losses it backpropagated (on every rank): by default each micro-batch's mean
loss scaled by 1/M, as gradient accumulation does, so the mean over the micro-batches.

Two schedules, drawn for P=3 stages and M=4 micro-batches (F = forward, B = backward of
micro-batch n, time to the right, . = idle):

    afab (GPipe, Huang et al. 2019): all forwards, then all backwards.
        stage 0  F0 F1 F2 F3 .  .  .  .  B0 B1 B2 B3
        stage 1  .  F0 F1 F2 F3 .  .  B0 B1 B2 B3 .
        stage 2  .  .  F0 F1 F2 F3 B0 B1 B2 B3 .  .
    Simple; every stage holds the activations of all M micro-batches at once.

    1f1b (PipeDream-Flush, Narayanan et al. 2021): after P-s-1 warm-up forwards, stage s
    alternates one forward, one backward, then drains the remaining backwards.
        stage 0  F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3
        stage 1  .  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .
        stage 2  .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .
    Same bubble, but stage s holds at most P-s micro-batches' activations instead of M.

Both leave each stage idle for (P-1) forward+backward slots out of M+P-1: the bubble fraction
(P-1)/(M+P-1). `last_step_stats` reports it next to the measured idle fraction, 1 - (time in
forward/backward) / (step time).

Communication is point-to-point: activations to the next stage, their gradients back. A send
and a receive that cross (send my output forward, receive a gradient from the same neighbour)
are posted together (`batch_isend_irecv`) so that two neighbours waiting on each other cannot
deadlock, as Megatron-LM's `send_forward_recv_backward` does. Under context parallelism a
stage computes only its rank's two chunks of every sequence, so that share, [B, S/C, h], is
what travels, between the ranks of the neighbour stages that hold the same chunks
(`ParallelDims.stage_rank`).

Data parallelism on top: the schedule is given the stage's data-parallel wrapper
(`grad_sync`, parallel/gradient_sync.py: our DDP, or ZeRO-2/3's ShardedDataParallel) and runs
every backward but the step's last inside its `no_sync()`, as the training loop's micro-batch
loop does; the tied embedding's two copies are summed through its `accumulated_grad`. The
caller's `finish_grad_sync()` follows the step.

The last stage's output is the mean cross-entropy of the micro-batch, or with `per_token` its
token log-probs [B, S] (vocab-parallel under tensor parallelism: the logits are never
gathered). A caller that weighs micro-batches otherwise, or has another loss (DPO), passes
`step(micro_batches, loss_fn, per_token)`: `loss_fn(output, micro_batch)` turns the output
into (the loss to backpropagate, metrics); the metrics, summed over the micro-batches, reach
every rank as `last_step_extras`. (The trainer's loss_fn returns each micro-batch's share of
the global batch's mean: trainer/global_batch.py.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from parallel.gradient_sync import GradientSync
from parallel.parallel_dims import ParallelDims
from parallel.pipeline_parallel.stage import PipelineStage, sync_shared_grads

SCHEDULES = ("afab", "1f1b")
# (the last stage's output: mean loss or token log-probs [B, S]; the micro-batch)
#     -> (the loss to backpropagate, metrics to log)
LossFn = Callable[[torch.Tensor, dict[str, torch.Tensor]],
                  tuple[torch.Tensor, dict[str, torch.Tensor]]]


def micro_batches_in_flight(schedule: str, stages: int, stage: int, micro_batches: int) -> int:
    """The most micro-batches whose activations stage `stage` holds at once (the drawings
    above): afab all M, 1f1b min(P - s, M); 1 without a pipeline (its micro-batch loop)."""
    if stages == 1:
        return 1
    return micro_batches if schedule == "afab" else min(stages - stage, micro_batches)


Action = tuple[str, int]  # ("F", n): forward of micro-batch n; ("B", n): its backward


def all_forward_all_backward_order(micro_batches: int) -> list[Action]:
    """Every stage's afab order: F0 .. F(M-1), then B0 .. B(M-1)."""
    return ([("F", index) for index in range(micro_batches)]
            + [("B", index) for index in range(micro_batches)])


def one_forward_one_backward_order(stages: int, stage: int, micro_batches: int) -> list[Action]:
    """Stage `stage`'s 1f1b order (drawn in the module docstring). Step 1: P-s-1 warm-up
    forwards, so that the last stage's first backward can start as soon as it is fed. Step 2:
    the steady state, each remaining forward followed by the backward of the oldest
    micro-batch still held (backwards run in micro-batch order, as the gradients come back).
    Step 3: cool-down, the backwards of the micro-batches still held. Stage s holds at most
    P-s at once.

        P=3, s=0, M=4:  F0 F1 | F2 B0 F3 B1 | B2 B3
        P=3, s=2, M=4:        | F0 B0 F1 B1 F2 B2 F3 B3
    """
    warmup = min(stages - stage - 1, micro_batches)
    order: list[Action] = [("F", index) for index in range(warmup)]
    for index in range(warmup, micro_batches):
        order += [("F", index), ("B", index - warmup)]
    order += [("B", index) for index in range(micro_batches - warmup, micro_batches)]
    return order


@dataclass
class PipelineStepStats:
    micro_batches: int
    stages: int
    bubble_theory: float
    """(P-1)/(M+P-1)."""
    bubble_measured: float
    """1 - compute time / step time on this rank."""
    step_seconds: float


class PipelineSchedule:
    def __init__(self, stage: PipelineStage, dims: ParallelDims, schedule: str = "1f1b",
                 sequence_parallel: bool = False, grad_sync: GradientSync | None = None
                 ) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"--pp_schedule {schedule!r}: choose one of {list(SCHEDULES)}")
        self.stage, self.dims, self.schedule = stage, dims, schedule
        self.sequence_parallel = sequence_parallel
        self.grad_sync = grad_sync
        """The stage's data-parallel wrapper (module docstring), None without one."""
        self.activation_dtype = next(self.model.parameters()).dtype
        self.last_step_stats: PipelineStepStats | None = None
        self.last_step_extras: dict[str, float] = {}

    @property
    def model(self) -> nn.Module:
        """This stage's module (what the data-parallel wrapper wraps)."""
        return self.stage.module

    # ---- point to point ---------------------------------------------------------------------
    def _activation_buffer(self, micro_batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """An empty tensor shaped like what the previous stage sends: [B, S/C(/T), hidden]
        (context parallelism: this rank's share of each sequence, its two chunks)."""
        batch_size, seq_len = micro_batch["input_ids"].shape
        seq_len //= self.dims.context_parallel
        if self.sequence_parallel:
            seq_len //= self.dims.tensor_parallel
        return torch.empty(batch_size, seq_len, self.stage.hidden_size,
                           dtype=self.activation_dtype, device=micro_batch["input_ids"].device)

    def _exchange(self, micro_batch: dict[str, torch.Tensor], send_next=None, send_prev=None,
                  recv_prev: bool = False, recv_next: bool = False
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Post the sends and receives with the neighbour stages together, wait for all.
        Returns (from previous stage, from next stage); what does not exist is skipped."""
        dims = self.dims
        has_prev, has_next = not dims.is_first_stage, not dims.is_last_stage
        prev_rank, next_rank = dims.stage_rank(dims.pp_rank - 1), dims.stage_rank(dims.pp_rank + 1)
        operations, from_prev, from_next = [], None, None
        if has_next and send_next is not None:
            operations.append(dist.P2POp(dist.isend, send_next.contiguous(), next_rank))
        if has_prev and send_prev is not None:
            operations.append(dist.P2POp(dist.isend, send_prev.contiguous(), prev_rank))
        if has_prev and recv_prev:
            from_prev = self._activation_buffer(micro_batch)
            operations.append(dist.P2POp(dist.irecv, from_prev, prev_rank))
        if has_next and recv_next:
            from_next = self._activation_buffer(micro_batch)
            operations.append(dist.P2POp(dist.irecv, from_next, next_rank))
        if operations:
            for work in dist.batch_isend_irecv(operations):
                work.wait()
        return from_prev, from_next

    # ---- one micro-batch ----------------------------------------------------------------------
    def _forward(self, index: int, micro_batch, stage_input) -> torch.Tensor:
        start = time.perf_counter()
        if stage_input is not None:
            stage_input.requires_grad_()
        output = self.stage.forward(stage_input, micro_batch, self._per_token)
        if self.dims.is_last_stage:
            output, extras = self._loss_fn(output, micro_batch)
            self._extras.append(extras)
            self._losses.append(output.detach())
        self._in_flight[index] = (stage_input, output)
        self._compute_seconds += time.perf_counter() - start
        return output

    def _backward(self, index: int, grad_output: torch.Tensor | None) -> torch.Tensor | None:
        """Backward of micro-batch `index` (its forward ran); the gradient of its input."""
        start = time.perf_counter()
        stage_input, output = self._in_flight.pop(index)
        self._backwards_left -= 1
        more_follow = self.grad_sync is not None and self._backwards_left > 0
        with self.grad_sync.no_sync() if more_follow else contextlib.nullcontext():
            torch.autograd.backward(output, grad_tensors=grad_output)
        self._compute_seconds += time.perf_counter() - start
        return stage_input.grad if stage_input is not None else None

    # ---- running an order ----------------------------------------------------------------------
    def _run(self, order: list[Action], micro_batches) -> None:
        """Run this stage's actions in `order`. A forward receives its input from the previous
        stage and sends its output on; a backward receives its output's gradient from the next
        stage and sends its input's gradient back. A send still pending is posted together
        with the next action's receive when both go to the same neighbour (an output out and
        a gradient in, or a gradient out and an input in: the crossings where two neighbours
        would otherwise wait on each other), and alone before it otherwise."""
        pending: tuple[str, torch.Tensor | None, dict] | None = None  # (to "next"/"prev", ...)
        for kind, index in order:
            micro_batch = micro_batches[index]
            receive_from = "prev" if kind == "F" else "next"
            if pending is not None and pending[0] != receive_from:
                self._send(pending)
                pending = None
            paired = pending[1] if pending is not None else None
            stage_input, grad_output = self._exchange(
                micro_batch, send_next=paired if receive_from == "next" else None,
                send_prev=paired if receive_from == "prev" else None,
                recv_prev=kind == "F", recv_next=kind == "B")
            if kind == "F":
                output = self._forward(index, micro_batch, stage_input)
                pending = ("next", output.detach(), micro_batch)
            else:
                pending = ("prev", self._backward(index, grad_output), micro_batch)
        if pending is not None:
            self._send(pending)

    def _send(self, pending: tuple[str, torch.Tensor | None, dict]) -> None:
        direction, tensor, micro_batch = pending
        if direction == "next":
            self._exchange(micro_batch, send_next=tensor)
        else:
            self._exchange(micro_batch, send_prev=tensor)

    @torch.no_grad()
    def forward_only(self, micro_batch: dict[str, torch.Tensor], per_token: bool = False
                     ) -> torch.Tensor:
        """The micro-batch's mean loss (`per_token`: its token log-probs [B, S], fp32) on every
        rank, no backward (evaluation, DPO's reference model)."""
        dims = self.dims
        stage_input, _ = self._exchange(micro_batch, recv_prev=True)
        output = self.stage.forward(stage_input, micro_batch, per_token)
        self._exchange(micro_batch, send_next=output)
        result = (output.float() if dims.is_last_stage
                  else torch.zeros(micro_batch["labels"].shape if per_token else (),
                                   dtype=torch.float32, device=output.device))
        if dims.pipeline_parallel > 1:
            dist.broadcast(result, src=dims.stage_rank(dims.pipeline_parallel - 1),
                           group=dims.pp_group)
        return result

    def step(self, micro_batches: list[dict[str, torch.Tensor]], loss_fn: LossFn | None = None,
             per_token: bool = False) -> torch.Tensor:
        """Forward and backward of every micro-batch; the sum of the backpropagated losses
        (fp32 scalar, every rank; by default the mean loss over the micro-batches). Each
        micro-batch: `input_ids`, `labels` [b, S] and optionally `attention_mask` (and
        whatever `loss_fn` reads; module docstring)."""
        dims = self.dims
        count = len(micro_batches)
        self._loss_fn = loss_fn or (lambda mean_loss, _: (mean_loss / count, {}))
        self._per_token = per_token
        self._extras: list[dict[str, torch.Tensor]] = []
        self._losses: list[torch.Tensor] = []
        self._in_flight: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        self._backwards_left = len(micro_batches)
        self._compute_seconds = 0.0
        start = time.perf_counter()
        self._run(all_forward_all_backward_order(count) if self.schedule == "afab"
                  else one_forward_one_backward_order(dims.pipeline_parallel, dims.pp_rank,
                                                      count), micro_batches)
        step_seconds = time.perf_counter() - start
        sync_shared_grads(self.stage, dims.embedding_group, self.grad_sync)
        loss = (torch.stack(self._losses).sum().float() if dims.is_last_stage
                else torch.zeros((), dtype=torch.float32,
                                 device=micro_batches[0]["input_ids"].device))
        if dims.pipeline_parallel > 1:
            dist.broadcast(loss, src=dims.stage_rank(dims.pipeline_parallel - 1),
                           group=dims.pp_group)
        self.last_step_extras = self._summed_extras()
        stages = dims.pipeline_parallel
        self.last_step_stats = PipelineStepStats(
            micro_batches=count, stages=stages,
            bubble_theory=(stages - 1) / (count + stages - 1),
            bubble_measured=1.0 - self._compute_seconds / step_seconds,
            step_seconds=step_seconds)
        return loss

    def _summed_extras(self) -> dict[str, float]:
        """The loss_fn's metrics summed over the micro-batches, sent from the last stage to
        the other stages (the logging rank 0 is on the first)."""
        sums = ({key: float(torch.stack([extras[key] for extras in self._extras]).sum())
                 for key in self._extras[0]} if self.dims.is_last_stage else None)
        if self.dims.pipeline_parallel > 1:
            box = [sums]
            dist.broadcast_object_list(box, src=self.dims.stage_rank(
                self.dims.pipeline_parallel - 1), group=self.dims.pp_group)
            sums = box[0]
        return sums
