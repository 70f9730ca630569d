"""contiguous pieces instead of a head chunk and a tail chunk.

Under a causal mask the sequence's end costs most: rank i holds chunks i and 2C-1-i of 2C, so
every rank gets the same work (the worked example in load_balance.py).
"""

from __future__ import annotations

import torch


def held_positions(rank: int, cp_size: int, seq_len: int,
                   device: torch.device | None = None) -> torch.Tensor:
    piece = seq_len // cp_size
    return torch.arange(rank * piece, (rank + 1) * piece, device=device)
