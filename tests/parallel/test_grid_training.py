"""Tensor, pipeline and data parallelism, alone and combined, train exactly like one process.

Each grid trains the tiny model 3 steps on the same global batches as a single process with
AdamW; losses and every weight (gathered whole on rank 0) must agree to fp32 rounding.
"""

from __future__ import annotations

import pytest
import torch

from parallel.local_ranks import run_on_ranks
from tests.parallel.grid_helpers import train_on_grid, train_single_process

# name: (world, tensor_parallel, pipeline_parallel, sequence_parallel, schedule, micro-batches)
TWO_RANK_GRIDS = {
    "tp2": (2, 2, 1, False, "1f1b", 2),
    "tp2_sequence_parallel": (2, 2, 1, True, "1f1b", 2),
    "pp2_afab": (2, 1, 2, False, "afab", 3),
    "pp2_1f1b": (2, 1, 2, False, "1f1b", 3),
}
FOUR_RANK_GRIDS = {
    "dp2xtp2": (4, 2, 1, True, "1f1b", 2),
    "dp2xpp2": (4, 1, 2, False, "1f1b", 3),
    "tp2xpp2": (4, 2, 2, True, "1f1b", 3),
}


def _train_grids(rank: int, world_size: int, grids: dict) -> dict:
    """Per grid: (losses, whole state as numpy arrays: they pickle by value, torch tensors
    would travel as shared-memory handles that die with this process)."""
    results = {}
    for name, grid in grids.items():
        losses, state, _ = train_on_grid(*grid)
        results[name] = (losses, state and {key: t.numpy() for key, t in state.items()})
    return results


@pytest.mark.parametrize("grids", [TWO_RANK_GRIDS, FOUR_RANK_GRIDS], ids=["2ranks", "4ranks"])
def test_grid_equals_single_process(grids):
    world_size = next(iter(grids.values()))[0]
    results = run_on_ranks(_train_grids, grids, world_size=world_size, timeout=600)
    for name, (world, tp, pp, _, _, num_micro) in grids.items():
        data_parallel = world // (tp * pp)
        ref_losses, ref_state, _ = train_single_process(data_parallel, num_micro)
        for rank in range(world):  # every rank reports the same (global) loss
            torch.testing.assert_close(results[rank][name][0], ref_losses, rtol=1e-5, atol=1e-6,
                                       msg=f"{name}: losses differ on rank {rank}")
        state = {key: torch.from_numpy(a) for key, a in results[0][name][1].items()}
        assert set(state) == set(ref_state), name
        # A wrong or missing gradient moves weights by about LR = 1e-2 (see ADAM_EPS).
        for key, value in ref_state.items():
            torch.testing.assert_close(state[key], value, rtol=1e-4, atol=1e-5,
                                       msg=f"{name}: {key} differs after 3 steps")
