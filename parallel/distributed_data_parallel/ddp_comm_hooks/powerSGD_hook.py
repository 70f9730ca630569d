"""PowerSGD: send two thin matrices instead of each gradient matrix.

Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization", NeurIPS 2019 (https://arxiv.org/abs/1905.13727), Algorithms 1 and 2.

Every gradient tensor is viewed as a matrix M (n x m = shape[0] x the rest). With a rank r and
a matrix Q (m x r) kept from the previous step ("warm start"), each rank w computes:

    Step I:   orthonormalise Q's columns, P = M_w Q, all-reduce P (sum over ranks)
    Step II:  orthonormalise P's columns, Q = M_w^T P, all-reduce Q (sum over ranks)
    Step III: M_w <- P Q^T / W  (= P P^T mean_w(M_w): the average projected onto span(P))

(The paper orthonormalises only P; orthonormalising the warm-started Q too keeps its span and
bounds P's magnitude, so a Q that grew over many steps cannot overflow a bf16/fp16 P.)

Each rank sends (n + m) r numbers instead of n m. Step III is the same on every rank because
P and Q are sums over ranks and every map above is linear in M. One step of this is one step
of subspace (power) iteration; reusing Q across training steps lets it converge over time.

Error feedback (Algorithm 2): what compression drops is not lost, only delayed. Each rank keeps
e_w = (its input) - (what was applied) and adds it to the next step's gradient, so that
    sum over steps of the applied gradients = sum over steps of the exact averages - mean_w(e_w)
(telescoping; tests check this identity).

Tensors for which compression does not pay (vectors, or n m <= min_compression_rate (n + m) r)
are sent uncompressed in one flat all-reduce. The first `start_powerSGD_iter` steps use a plain
all-reduce: early gradients change fast and low-rank compression hurts most there.

Timing: Step I and the uncompressed all-reduce start inside the hook, during backward; Steps
II-III run in the returned handle's `wait()`, i.e. in `finish_grad_sync()`. On CUDA all of it
runs on a side stream (events order it against the compute stream), so the host only enqueues
and the compression overlaps with other buckets' plain reductions.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from parallel.side_stream import SideStream

from ..param_and_grad_buffer import Bucket
from .default_hooks import CommHandle, allreduce_average_async, allreduce_hook, allreduce_wire_bytes


class PowerSGDState:
    """Settings plus the per-rank memory PowerSGD carries from step to step (checkpointable)."""

    def __init__(self, process_group: dist.ProcessGroup | None = None,
                 matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 10,
                 min_compression_rate: float = 2.0, use_error_feedback: bool = True,
                 warm_start: bool = True, seed: int = 0) -> None:
        if matrix_approximation_rank < 1:
            raise ValueError(f"matrix_approximation_rank must be >= 1, got "
                             f"{matrix_approximation_rank}")
        self.process_group = process_group
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.seed = seed
        self.iter = 0
        """Training steps seen so far (counted when the step's last bucket is launched)."""
        self.error_dict: dict[int, Tensor] = {}
        """Per bucket (global index): this rank's input minus what was applied, flat."""
        self.q_memory_dict: dict[int, Tensor] = {}
        """Per bucket: the Q matrices of its compressed tensors, flat (warm start)."""
        self.side_stream = SideStream()
        """Where the compression math runs on CUDA (parallel/side_stream.py)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything a bitwise resume needs (the error buffers differ per rank)."""
        return {"iter": self.iter,
                "error_dict": {key: value.cpu().clone() for key, value in self.error_dict.items()},
                "q_memory_dict": {key: value.cpu().clone()
                                  for key, value in self.q_memory_dict.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.iter = int(state["iter"])
        self.error_dict = dict(state["error_dict"])
        self.q_memory_dict = dict(state["q_memory_dict"])


def _should_compress(num_rows: int, num_cols: int, rank: int, min_compression_rate: float,
                     ) -> bool:
    """Compress only when it shrinks the tensor by more than `min_compression_rate`."""
    return num_rows * num_cols > min_compression_rate * (num_rows + num_cols) * rank


def orthonormalize_columns_(matrix: Tensor) -> None:
    """Replace `matrix`'s columns, in place, by an orthonormal basis of their span.

    We take Q of a QR factorisation (Householder reflections). The paper describes Gram-Schmidt
    (subtract from column i its projections on columns 0..i-1, then normalise), which gives the
    same basis up to column signs, and those cancel in P P^T; Householder QR stays orthonormal
    even when columns are (nearly) dependent, e.g. a gradient of lower rank than r, where
    Gram-Schmidt divides by ~0. QR has no fp16/bf16 kernels, so it runs in fp32.
    """
    matrix.copy_(torch.linalg.qr(matrix.float(), mode="reduced").Q)


def _initial_q(seed: int, bucket_key: int, step: int, numel: int) -> Tensor:
    """Random Q, identical on every rank: seeded by (seed, bucket, step), drawn on the CPU."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + bucket_key * 10_007 + step)
    return torch.randn(numel, generator=generator)


def powerSGD_hook(state: PowerSGDState, bucket: Bucket) -> CommHandle:
    """Reduce `bucket` with rank-r PowerSGD (see the module docstring for the steps)."""
    step = state.iter
    if bucket.is_last:
        state.iter += 1
    group, world_size = state.process_group, dist.get_world_size(state.process_group)
    grad, key = bucket.grad_data, bucket.global_index

    # Sort the bucket's tensors into matrices worth compressing and the rest.
    matrices, uncompressed = [], []
    for view in bucket.grad_views():
        if view.dim() >= 2:
            matrix = view.view(view.shape[0], -1)
            rank = min(*matrix.shape, state.matrix_approximation_rank)
            if _should_compress(*matrix.shape, rank, state.min_compression_rate):
                matrices.append((matrix, rank))
                continue
        uncompressed.append(view)
    if step < state.start_powerSGD_iter or not matrices:  # warm-up, or nothing to compress
        return allreduce_hook(group, bucket)

    stream = state.side_stream.on(grad.device)
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream(grad.device))  # gradients are written

    with _on_stream(stream):
        if state.use_error_feedback:
            if key not in state.error_dict:
                state.error_dict[key] = torch.zeros_like(grad)
            error = state.error_dict[key] = _like_grad(state.error_dict[key], grad, stream)
            grad.add_(error)
            error.copy_(grad)  # holds the input until Step III turns it into input - applied

        p_memory = grad.new_empty(sum(m.shape[0] * r for m, r in matrices))
        if key not in state.q_memory_dict or not state.warm_start:
            q_numel = sum(m.shape[1] * r for m, r in matrices)
            state.q_memory_dict[key] = _initial_q(state.seed, key, step, q_numel)
        q_memory = state.q_memory_dict[key] = _like_grad(state.q_memory_dict[key], grad, stream)
        ps = _split(p_memory, [(m.shape[0], r) for m, r in matrices])
        qs = _split(q_memory, [(m.shape[1], r) for m, r in matrices])

        # Step I: P = M Q (Q orthonormalised first: same span, bounded magnitude).
        for (matrix, _), p, q in zip(matrices, ps, qs):
            orthonormalize_columns_(q)
            torch.matmul(matrix, q, out=p)
        flat_uncompressed = (torch.cat([t.reshape(-1) for t in uncompressed]) if uncompressed
                             else grad.new_empty(0))
        uncompressed_work = allreduce_average_async(flat_uncompressed, group)
        p_work = dist.all_reduce(p_memory, group=group, async_op=True)

    def steps_two_and_three() -> None:
        with _on_stream(stream):
            uncompressed_work.wait()
            offset = 0
            for tensor in uncompressed:
                tensor.copy_(flat_uncompressed[offset:offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()
            p_work.wait()
            # Step II: Q = M^T P with P orthonormal, summed over ranks.
            for (matrix, _), p, q in zip(matrices, ps, qs):
                orthonormalize_columns_(p)
                torch.matmul(matrix.t(), p, out=q)
            dist.all_reduce(q_memory, group=group, async_op=True).wait()
            # Step III: the average gradient, approximated: P Q^T / W.
            for (matrix, _), p, q in zip(matrices, ps, qs):
                torch.matmul(p, q.t(), out=matrix)
                matrix.div_(world_size)
            if state.use_error_feedback:
                # input - applied. For tensors sent uncompressed this is g_w - mean(g): it
                # averages to zero over ranks, so the next all-reduce cancels it.
                error.sub_(grad)
        if stream is not None:
            torch.cuda.current_stream(grad.device).wait_stream(stream)

    bytes_sent = sum(allreduce_wire_bytes(t, world_size)
                     for t in (flat_uncompressed, p_memory, q_memory))
    return CommHandle([], bytes_sent, on_complete=steps_two_and_three)


def _like_grad(buffer: Tensor, grad: Tensor, stream: Any) -> Tensor:
    """`buffer` (error or Q memory) in `grad`'s dtype and device; a new tensor only after a
    reload whose saved buffers differ (e.g. fp32 buffers for bf16 gradients). The conversion
    reads the old buffer on the side stream; a GPU buffer made by the reload belongs to the
    compute stream, whose allocator would hand its memory out again as soon as Python drops it,
    while the side stream may still be reading it: `record_stream` makes the allocator wait
    for the side stream's queued work first."""
    converted = buffer.to(grad)
    if stream is not None and converted is not buffer and buffer.device == grad.device:
        buffer.record_stream(stream)
    return converted


def _on_stream(stream: Any) -> Any:
    """Run the enclosed work on `stream` (CUDA), or inline when there is none (CPU)."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _split(flat: Tensor, shapes: list[tuple[int, int]]) -> list[Tensor]:
    """Consecutive (rows x cols) matrix views of a flat tensor."""
    views, offset = [], 0
    for rows, cols in shapes:
        views.append(flat[offset:offset + rows * cols].view(rows, cols))
        offset += rows * cols
    assert offset == flat.numel()
    return views

