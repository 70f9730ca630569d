"""Causal load balancing: which tokens of a sequence each context-parallel rank holds.

Under causal attention token t attends to tokens 0..t, so the end of a sequence costs more
than its start. Cut a sequence of S tokens into C contiguous pieces and the last rank does
about 2C-1 times the work of the first, and everyone waits for it. Cut it instead into 2C
chunks and give rank i chunk i and chunk 2C-1-i (one from the cheap head, one from the
expensive tail; Megatron-LM and torch's head-tail balancer do the same): every rank then does
the same work. Worked example, S = 8 tokens, C = 2 ranks, so 4 chunks of 2 tokens:

    tokens    a b | c d | e f | g h          chunk 0 1 2 3
    rank 0    a b           g h              chunks 0 and 3, positions [0, 1, 6, 7]
    rank 1          c d   e f                chunks 1 and 2, positions [2, 3, 4, 5]

Each rank keeps its two chunks end to end, [B, S/C, ...]. Everything indexed by token is cut
the same way: input ids, labels, the key padding mask and the position ids (RoPE is applied
to the tokens a rank holds, at their own positions: `shard_sequence(position_ids_for(...))`
for padded or packed rows, `held_positions` for plain ones).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel.flat_collectives import all_gather_single

SEQUENCE_DIM = 1


def _check_divisible(seq_len: int, cp_size: int) -> int:
    """The chunk length S / 2C, or a ValueError naming the sizes."""
    if seq_len % (2 * cp_size):
        raise ValueError(f"sequence length {seq_len} is not divisible by 2 x context_parallel "
                         f"= {2 * cp_size} (each rank holds two equal chunks)")
    return seq_len // (2 * cp_size)


def held_chunks(rank: int, cp_size: int) -> tuple[int, int]:
    """The two chunks (of 2C) that `rank` holds, head first: (i, 2C-1-i)."""
    return rank, 2 * cp_size - 1 - rank


def held_positions(rank: int, cp_size: int, seq_len: int,
                   device: torch.device | None = None) -> torch.Tensor:
    """Positions in the whole sequence of the S/C tokens `rank` holds, in the order it holds
    them ([0, 1, 6, 7] for rank 0 in the example above)."""
    chunk_len = _check_divisible(seq_len, cp_size)
    return torch.cat([torch.arange(chunk * chunk_len, (chunk + 1) * chunk_len, device=device)
                      for chunk in held_chunks(rank, cp_size)])


def shard_sequence(tensor: torch.Tensor, rank: int, cp_size: int,
                   dim: int = SEQUENCE_DIM) -> torch.Tensor:
    """This rank's two chunks of `tensor` along `dim`, end to end (no communication)."""
    _check_divisible(tensor.shape[dim], cp_size)
    chunks = tensor.chunk(2 * cp_size, dim=dim)
    head, tail = held_chunks(rank, cp_size)
    return torch.cat([chunks[head], chunks[tail]], dim=dim)


def unshard_sequence(shards: list[torch.Tensor], dim: int = SEQUENCE_DIM) -> torch.Tensor:
    """The whole sequence from every rank's shard (in rank order): the inverse of
    `shard_sequence`. Rank i's first half goes back to chunk i, its second to chunk 2C-1-i."""
    cp_size = len(shards)
    chunks: list[torch.Tensor | None] = [None] * (2 * cp_size)
    for rank, shard in enumerate(shards):
        head, tail = held_chunks(rank, cp_size)
        chunks[head], chunks[tail] = shard.chunk(2, dim=dim)
    return torch.cat(chunks, dim=dim)


def gather_sequence(tensor: torch.Tensor, group: dist.ProcessGroup,
                    dim: int = SEQUENCE_DIM) -> torch.Tensor:
    """All-gather every rank's shard and put the tokens back in sequence order (no autograd:
    for logits at evaluation, and for the tests)."""
    cp_size = dist.get_world_size(group)
    moved = tensor.movedim(dim, 0).contiguous()
    gathered = moved.new_empty((cp_size * moved.shape[0], *moved.shape[1:]))
    all_gather_single(gathered, moved, group=group)
    return unshard_sequence(list(gathered.chunk(cp_size)), dim=0).movedim(0, dim)
