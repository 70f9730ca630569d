"""A distributed sampler whose position can be saved and restored exactly (docs/design.md §3).

The data order is a pure function of (seed, epoch, global position), never of history:

    the global stream = order(epoch 0) ++ order(epoch 1) ++ ...   (endless)
    order(epoch)      = a permutation of range(num_samples) drawn from
                        numpy.random.default_rng([seed, epoch])     (arange when shuffle=False)
    rank r of W       takes stream positions t + r, t + r + W, t + r + 2W, ...
                      where t = samples consumed so far by all ranks together

Worked example, num_samples N = 5, W = 2 ranks (the permutations are made up for the example):

    stream position   0  1  2  3  4 | 5  6  7  8  9 | 10 ...
    epoch / index     0/0 .. 0/4    | 1/0 .. 1/4    | 2/0
    sample            3  0  4  1  2 | 1  4  2  0  3 | ...
    rank 0 yields     3     4     2 |    4     0    |       (positions 0, 2, 4, 6, 8)
    rank 1 yields        0     1    | 1     2     3 |       (positions 1, 3, 5, 7, 9)

Each step of the two ranks consumes one global row of W positions: [3 0] [4 1] [2 1] [4 2] ...
After 3 steps t = 6, and `state_dict()` = {"seed": s, "epoch": 1, "consumed_samples": 1}
(t = epoch * N + consumed_samples). Restarting with W = 3 continues the same stream at t = 6:
rank 0 takes positions 6, 9, ... (4, 3), rank 1 takes 7 (2), rank 2 takes 8 (0) -- the union of
the ranks' next rows is exactly the rest of the stream, so nothing is repeated or skipped.
Resuming is O(1): only the current epoch's permutation is computed, nothing is replayed.

Consequences worth knowing:
- A global batch is a contiguous stretch of the stream, so with the same global batch size the
  same samples form each batch whatever W is; only their assignment to ranks changes.
- `consumed_samples` need not be a multiple of W (a checkpoint written under another world size
  or batch size): the next row simply starts there.
- Within an epoch no sample repeats. A row that straddles the end of an epoch may contain a
  sample twice (its last use in one epoch and its first in the next), as with any loader that
  concatenates epochs; nothing is dropped to avoid that, so every sample is used every epoch.
- `state_dict()` describes what the iterator has *yielded*. A DataLoader prefetches ahead of
  the training step, so the trainer should save `state_dict_at(samples the optimizer has
  consumed)` instead, which depends only on its own step count.
- The permutation costs O(num_samples) memory (int32 below 2**31 samples): 40 MB for 10M.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch.utils.data

STATE_KEYS = ("seed", "epoch", "consumed_samples")


class StatefulDistributedSampler(torch.utils.data.Sampler[int]):
    """Yields this rank's sample indices forever; see the module docstring for the layout."""

    def __init__(self, num_samples: int, rank: int = 0, world_size: int = 1, seed: int = 0,
                 shuffle: bool = True) -> None:
        if num_samples < 1:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.num_samples = num_samples
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.total_consumed = 0  # stream positions consumed by all ranks since the start
        self._cached_epoch: int | None = None
        self._cached_order: np.ndarray | None = None

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The sample order of one epoch: a pure function of (seed, epoch). The last one is
        cached, because consecutive positions almost always fall in the same epoch."""
        if epoch != self._cached_epoch:
            dtype = np.int32 if self.num_samples < 2**31 else np.int64
            if self.shuffle:
                rng = np.random.default_rng([self.seed, epoch])
                order = rng.permutation(self.num_samples).astype(dtype, copy=False)
            else:
                order = np.arange(self.num_samples, dtype=dtype)
            self._cached_epoch, self._cached_order = epoch, order
        return self._cached_order

    def __iter__(self) -> Iterator[int]:
        """This rank's indices, continuing from the current state. Keep one live iterator per
        sampler: they share the position."""
        while True:
            epoch, index = divmod(self.total_consumed + self.rank, self.num_samples)
            sample = int(self.epoch_order(epoch)[index])
            # Count the whole row as consumed *before* yielding: a generator pauses at `yield`,
            # and a state saved right after receiving this sample must already include it.
            self.total_consumed += self.world_size
            yield sample

    def state_dict_at(self, total_consumed_samples: int) -> dict[str, int]:
        """The state after `total_consumed_samples` stream positions (all ranks, all epochs)."""
        if total_consumed_samples < 0:
            raise ValueError(f"total_consumed_samples must be >= 0, got {total_consumed_samples}")
        epoch, consumed_samples = divmod(total_consumed_samples, self.num_samples)
        return {"seed": self.seed, "epoch": epoch, "consumed_samples": consumed_samples}

    def state_dict(self) -> dict[str, int]:
        """{"seed", "epoch", "consumed_samples" (global, within the current epoch)}."""
        return self.state_dict_at(self.total_consumed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the first stream position not yet consumed, whatever the world size."""
        if set(state) != set(STATE_KEYS):
            raise ValueError(f"sampler state must have exactly the keys {STATE_KEYS}; "
                             f"got {sorted(state)}")
        if state["seed"] != self.seed:
            raise ValueError(f"checkpoint's data order used seed {state['seed']}, this run uses "
                             f"{self.seed}: resuming would silently change the data order")
        if not 0 <= state["consumed_samples"] < self.num_samples or state["epoch"] < 0:
            raise ValueError(f"sampler state {state} does not fit a dataset of "
                             f"{self.num_samples} samples (did the dataset change?)")
        self.total_consumed = state["epoch"] * self.num_samples + state["consumed_samples"]
