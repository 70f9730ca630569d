"""The device grid's rank layout and its up-front shape checks (no processes needed)."""

from __future__ import annotations

import itertools

import pytest

from parallel.parallel_dims import ParallelDims, check_parallel_shapes
from tests.model.model_helpers import small_config


def test_groups_partition_ranks_and_agree_with_coordinates():
    dims = ParallelDims(world_size=8, tensor_parallel=2, pipeline_parallel=2)
    assert dims.data_parallel == 2
    groups = dims.group_ranks()
    assert groups["tp"][:2] == [[0, 1], [2, 3]]  # the docstring's worked example
    assert groups["dp"][:2] == [[0, 2], [1, 3]]
    assert groups["pp"][:2] == [[0, 4], [1, 5]]
    for dimension, position in (("pp", 0), ("dp", 1), ("tp", 2)):
        assert sorted(itertools.chain(*groups[dimension])) == list(range(8))
        for ranks in groups[dimension]:  # inside a group only that coordinate changes
            coords = [dims.coordinates(rank) for rank in ranks]
            assert [c[position] for c in coords] == list(range(len(ranks)))
            others = {tuple(c[i] for i in range(3) if i != position) for c in coords}
            assert len(others) == 1
    for rank in range(8):
        assert dims.rank_of(*dims.coordinates(rank)) == rank


@pytest.mark.parametrize("kwargs, message", [
    (dict(world_size=6, tensor_parallel=4), "world size 6 is not divisible"),
    (dict(world_size=4, tensor_parallel=4), "num_key_value_heads 2"),
    (dict(world_size=3, pipeline_parallel=3), "num_hidden_layers 2"),
    (dict(world_size=2, sequence_parallel=True), "--sequence_parallel needs"),
    (dict(world_size=2, tensor_parallel=2, sequence_parallel=True, seq_len=9),
     "sequence length 9"),
])
def test_shape_check_names_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_parallel_shapes(small_config("gqa"), **kwargs)


def test_shape_check_accepts_a_valid_grid():
    check_parallel_shapes(small_config("gqa"), world_size=8, tensor_parallel=2,
                          pipeline_parallel=2, sequence_parallel=True, seq_len=16)
