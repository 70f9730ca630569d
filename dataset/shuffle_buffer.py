"""A bounded shuffle buffer whose state is small and explicit, and the seeded draws behind it.

A stream cannot be permuted whole; a buffer of B samples gives a local shuffle: keep B samples,
hand out a random one, put the next arriving sample in its place. Its state is its contents
plus *how many random draws it made*: every draw is a pure function of (key, draw number), so
a resumed buffer continues with exactly the draws an uninterrupted one would have made.

Worked example, B = 3, arriving samples a b c d e ..., draws u = 0.9, 0.1, ...:
    fill         [a b c]
    draw 0.9     index int(0.9 * 3) = 2 -> hand out c;  [a b] + d -> [a b d]
    draw 0.1     index 0 -> hand out a (the last one, d, moves into its slot);  [d b] + e
B = 0 turns shuffling off: samples come out in arrival order.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

DRAW_BLOCK = 4096  # uniforms generated per numpy call; draw n lives in block n // DRAW_BLOCK


class CountedUniforms:
    """Uniform floats in [0, 1): draw n is a pure function of (key, n). State: the count."""

    def __init__(self, key: list[int], count: int = 0) -> None:
        self.key, self.count = list(key), count
        self._block_index: int | None = None
        self._block = np.empty(0)

    def next(self) -> float:
        block_index, within = divmod(self.count, DRAW_BLOCK)
        if block_index != self._block_index:
            self._block = np.random.default_rng([*self.key, block_index]).random(DRAW_BLOCK)
            self._block_index = block_index
        self.count += 1
        return float(self._block[within])


class ShuffleBuffer:
    """Samples go in with `add`, come out with `pop`; call `add` while `wants_more()`."""

    def __init__(self, capacity: int, key: list[int]) -> None:
        if capacity < 0:
            raise ValueError(f"shuffle buffer capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.items: collections.deque[Any] = collections.deque()
        self.draws = CountedUniforms(key)

    def wants_more(self) -> bool:
        return len(self.items) < max(self.capacity, 1)

    def add(self, items: list[Any]) -> None:
        self.items.extend(items)

    def pop(self) -> Any:
        if self.capacity == 0:
            return self.items.popleft()
        index = int(self.draws.next() * len(self.items))
        self.items[index], self.items[-1] = self.items[-1], self.items[index]
        return self.items.pop()

    def state_dict(self) -> dict[str, Any]:
        return {"items": list(self.items), "draws": self.draws.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.items = collections.deque(state["items"])
        self.draws = CountedUniforms(self.draws.key, state["draws"])
