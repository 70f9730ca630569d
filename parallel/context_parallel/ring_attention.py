"""Ring attention (Liu et al. 2023) on the load-balanced layout, forward and backward written out.

Each of the C ranks of the context-parallel group holds the queries, keys and values of its
S/C tokens (chunks i and 2C-1-i of 2C, `load_balance.py`). Attention needs every key, so:

Step 1  The ring. In C steps each rank sees every K/V block: at step s rank i holds the block
        of rank (i - s) mod C. While it computes on that block it already sends it to rank
        i+1 and receives the next one from rank i-1 (point-to-point, overlapped with the
        compute where the backend runs sends in the background):

            step 0   r0: KV0   r1: KV1   r2: KV2   r3: KV3     (its own)
            step 1   r0: KV3   r1: KV0   r2: KV1   r3: KV2     (every block one rank on)
            step 2   r0: KV2   r1: KV3   r2: KV0   r3: KV1

Step 2  Attend to the block, computing only the part causality allows. With the layout above,
        rank i's queries (chunks i, 2C-1-i) against the keys of rank j (chunks j, 2C-1-j):

            j = i   diagonal: causal within the 2 chunks (head-head and tail-tail diagonal,
                    tail-head full, head-tail skipped)
            j < i   all my queries x j's head chunk: full (j's tail lies after all of them)
            j > i   my tail chunk x all j's keys: full (my head lies before all of them)

        so every step after the first costs exactly half a block on every rank: balanced.
        Padding and packed samples add the sample-id rule (`allowed_pairs`); the block's sample
        ids travel with its K/V, and the positions are known from the rank it came from.

Step 3  Merge the block's (out, lse) into the running result with the log-sum-exp rule
        (`block_attention.merge_into`).

Backward: the same ring. dQ of my queries accumulates here. dK/dV of a block are summed by
every rank that attended to it, so an accumulator travels with the block: rank i adds its
share and passes it on to i+1, and after the C-th pass it is back with the block's owner
(one send more than the K/V). Nothing goes through autograd: the communication is explicit in
both directions.

Kernels, chosen per call from the activations: a block's forward runs on flash-attn (with its
lse) on a CUDA GPU it serves, in bf16/fp16 (flash_blocks.py); otherwise, and for every
backward, blocks are plain matmul/softmax with sums in fp32 (or fp64), on any device (SDPA
returns no lse).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from parallel.context_parallel.block_attention import (
    BlockMask,
    attend_block,
    block_grads,
    merge_into,
)
from parallel.context_parallel.flash_blocks import flash_attend_block, why_not_flash_blocks
from parallel.context_parallel.load_balance import held_positions


class _Ring:
    """The context-parallel group as a ring: send to rank + 1, receive from rank - 1.

    Every rank posts its sends and receives in the same order, and messages between two ranks
    are matched in the order they were posted, so in the backward the K/V block and the dK/dV
    accumulator, both in flight at once, never swap."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.previous = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def pass_on(self, tensors: list[torch.Tensor]) -> _InFlight:
        """Start sending `tensors` on and receiving the previous rank's (same shapes); one
        batch of point-to-point ops, so the backend may run them together."""
        if self.size == 1:
            return _InFlight(tensors, [])
        received = [torch.empty_like(tensor) for tensor in tensors]
        ops = ([dist.P2POp(dist.isend, tensor, self.next, self.group) for tensor in tensors]
               + [dist.P2POp(dist.irecv, tensor, self.previous, self.group)
                  for tensor in received])
        return _InFlight(received, dist.batch_isend_irecv(ops))


@dataclass
class _InFlight:
    received: list[torch.Tensor]
    works: list

    def wait(self) -> list[torch.Tensor]:
        for work in self.works:
            work.wait()
        return self.received


def block_work(rank: int, source: int, chunk_len: int) -> tuple[slice, slice]:
    """Step 2's table: (slice of my queries, slice of the source rank's keys) that causality
    leaves to compute; the rest of the block is masked, so skipped."""
    if source == rank:
        return slice(None), slice(None)  # diagonal
    if source < rank:
        return slice(None), slice(0, chunk_len)  # all my queries x its head chunk
    return slice(chunk_len, None), slice(None)  # my tail chunk x all its keys


@dataclass(frozen=True)
class _Blocks:
    """Step 2's table for this rank: which of its queries meet which keys of a source rank."""
    rank: int
    cp_size: int
    query_ids: torch.Tensor | None  # [B, S/C] my sample ids, None = one unpadded sample
    query_pos: torch.Tensor         # [S/C] positions of my tokens in the whole sequence

    def work(self, source: int, key_ids: torch.Tensor | None
             ) -> tuple[slice, slice, BlockMask]:
        """(my query slice, the source's key slice, who may attend to whom there)."""
        queries, keys = block_work(self.rank, source, len(self.query_pos) // 2)
        key_pos = held_positions(source, self.cp_size, len(self.query_pos) * self.cp_size,
                                 self.query_pos.device)
        query_ids = None if self.query_ids is None else self.query_ids[:, queries]
        key_ids = None if key_ids is None else key_ids[:, keys]
        return queries, keys, BlockMask(source == self.rank, self.query_pos[queries],
                                        key_pos[keys], query_ids, key_ids)


def _visit_blocks(ring: _Ring, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  sample_ids: torch.Tensor | None, dtype: torch.dtype
                  ) -> Iterator[tuple[slice, slice, BlockMask, torch.Tensor, torch.Tensor]]:
    """Steps 1 and 2, shared by forward and backward: yield every K/V block in ring order as
    (my query slice, its key slice, mask, key, value) for the caller to compute on, while the
    block is already on its way to the next rank."""
    blocks = _Blocks(ring.rank, ring.size, sample_ids,
                     held_positions(ring.rank, ring.size, query.shape[1] * ring.size,
                                    query.device))
    block = [torch.stack([key, value])] + ([] if sample_ids is None else [sample_ids])
    for step in range(ring.size):
        source = (ring.rank - step) % ring.size
        # Step 1: pass the block on while computing on it (not after the last step).
        in_flight = ring.pass_on(block) if step < ring.size - 1 else None
        # Step 2: the part of the block that causality allows.
        queries, keys, mask = blocks.work(source, block[1] if len(block) > 1 else None)
        key_value = block[0][:, :, keys].to(dtype)
        yield queries, keys, mask, key_value[0], key_value[1]
        if in_flight is not None:
            block = in_flight.wait()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, sample_ids, group, scale):
        ring, dtype = _Ring(group), torch.promote_types(query.dtype, torch.float32)
        # The kernel of every block (flash_blocks.py): flash-attn reads the blocks in bf16/fp16
        # and returns its lse in fp32; the plain path computes in fp32 (or fp64).
        on_flash = not why_not_flash_blocks(query.device, query.dtype, query.shape[-1])
        block_dtype = query.dtype if on_flash else dtype
        block_query = query.to(block_dtype)
        out = query.new_zeros(query.shape, dtype=dtype)
        lse = query.new_full(query.shape[:3], float("-inf"), dtype=dtype)
        for queries, _, mask, block_key, block_value in _visit_blocks(
                ring, query, key, value, sample_ids, block_dtype):
            if on_flash:
                block_out, block_lse = flash_attend_block(block_query[:, queries], block_key,
                                                          block_value, mask, scale)
            else:
                block_out, block_lse = attend_block(block_query[:, queries], block_key,
                                                    block_value, mask.allowed(), scale)
            # Step 3: merge with the log-sum-exp rule.
            merge_into(out[:, queries], lse[:, queries], block_out.to(dtype), block_lse)
        out = out.to(query.dtype)
        ctx.save_for_backward(query, key, value, sample_ids, out, lse)
        ctx.group, ctx.scale = group, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, sample_ids, out, lse = ctx.saved_tensors
        ring, dtype = _Ring(ctx.group), torch.promote_types(query.dtype, torch.float32)
        query_up, grad_out = query.to(dtype), grad_out.to(dtype)
        delta = (grad_out * out.to(dtype)).sum(dim=-1)  # rowsum(dO * O), [B, S/C, H]
        grad_query = torch.zeros_like(query_up)
        arriving = None  # the dK/dV accumulator of the block I hold, from rank - 1
        for queries, keys, mask, block_key, block_value in _visit_blocks(
                ring, query, key, value, sample_ids, dtype):
            grads = block_grads(query_up[:, queries], block_key, block_value, mask.allowed(),
                                ctx.scale, lse[:, queries], grad_out[:, queries],
                                delta[:, queries])
            grad_query[:, queries] += grads[0]
            grad_key_value = (query_up.new_zeros((2, *key.shape)) if arriving is None
                              else arriving.wait()[0])
            grad_key_value[0][:, keys] += grads[1]
            grad_key_value[1][:, keys] += grads[2]
            arriving = ring.pass_on([grad_key_value])  # after the last step: to its owner
        grad_key, grad_value = arriving.wait()[0]
        return (grad_query.to(query.dtype), grad_key.to(key.dtype), grad_value.to(value.dtype),
                None, None, None)


def ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   group: dist.ProcessGroup, sample_ids: torch.Tensor | None = None,
                   scale: float | None = None) -> torch.Tensor:
    """Causal attention over the whole sequence, of this rank's load-balanced tokens.

    query [B, S/C, H, D]; key/value [B, S/C, KV, D], the KV heads (GQA: not repeated);
    sample_ids [B, S/C] this rank's shard of the key padding mask (0 = padding, else the
    sample's number, as `--pack_samples` numbers them), None when unpadded. Returns
    [B, S/C, H, D], what full attention gives for these tokens. No dropout.
    """
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    sample_ids = None if sample_ids is None else sample_ids.long()  # bool masks too; gloo sends
    return _RingAttention.apply(query, key, value, sample_ids, group, scale)
