"""Tensor, pipeline, context and data parallelism, alone and combined, train exactly like one
process.

Each grid trains the tiny model 3 steps on the same global batches as a single process with
AdamW; losses and every weight (gathered whole on rank 0) must agree to fp32 rounding.
"""

from __future__ import annotations

import pytest

from parallel.local_ranks import run_on_ranks
from tests.parallel.grid_helpers import assert_grids_equal_single_process, train_grids

# name: (world, tensor_parallel, pipeline_parallel, sequence_parallel, schedule, micro-batches
# [, context_parallel]): grid_helpers.Grid
TWO_RANK_GRIDS = {
    "cp2": (2, 1, 1, False, "1f1b", 2, 2),
    "tp2": (2, 2, 1, False, "1f1b", 2),
    "tp2_sequence_parallel": (2, 2, 1, True, "1f1b", 2),
    "pp2_afab": (2, 1, 2, False, "afab", 3),
    "pp2_1f1b": (2, 1, 2, False, "1f1b", 3),
}
FOUR_RANK_GRIDS = {
    "dp2xtp2": (4, 2, 1, True, "1f1b", 2),
    "dp2xpp2": (4, 1, 2, False, "1f1b", 3),
    "tp2xpp2": (4, 2, 2, True, "1f1b", 3),
    "dp2xcp2": (4, 1, 1, False, "1f1b", 2, 2),
    "cp2xtp2": (4, 2, 1, False, "1f1b", 2, 2),
    "cp2xtp2_sequence_parallel": (4, 2, 1, True, "1f1b", 2, 2),
}


@pytest.mark.parametrize("grids", [TWO_RANK_GRIDS, FOUR_RANK_GRIDS], ids=["2ranks", "4ranks"])
def test_grid_equals_single_process(grids):
    world_size = next(iter(grids.values()))[0]
    results = run_on_ranks(train_grids, grids, world_size=world_size, timeout=600)
    assert_grids_equal_single_process(results, grids)
