"""first fit without sorting the samples longest first.

First fit in arrival order leaves gaps a later long sample cannot use; taking the samples
longest first (first fit *decreasing*) packs them into fewer rows, and is the order the worked
example in dataset/sft_packing.py follows.
"""

from __future__ import annotations


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    rows: list[list[int]] = []
    room: list[int] = []
    for index in range(len(lengths)):
        if lengths[index] > capacity:
            raise ValueError(f"a sample of {lengths[index]} tokens does not fit")
        row = next((r for r, free in enumerate(room) if free >= lengths[index]), len(rows))
        if row == len(rows):
            rows.append([])
            room.append(capacity)
        rows[row].append(index)
        room[row] -= lengths[index]
    return rows
