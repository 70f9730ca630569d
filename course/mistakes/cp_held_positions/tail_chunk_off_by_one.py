"""the tail chunk off by one (2C - i instead of 2C - 1 - i).

Chunks are numbered 0 .. 2C-1; rank i's tail chunk mirrors its head chunk i from the end: 2C - 1
- i (held_chunks).
"""

from __future__ import annotations

import torch

from parallel.context_parallel.load_balance import _check_divisible


def held_positions(rank: int, cp_size: int, seq_len: int,
                   device: torch.device | None = None) -> torch.Tensor:
    chunk_len = _check_divisible(seq_len, cp_size)
    chunks = (rank, (2 * cp_size - rank) % (2 * cp_size))
    return torch.cat([torch.arange(chunk * chunk_len, (chunk + 1) * chunk_len, device=device)
                      for chunk in chunks])
