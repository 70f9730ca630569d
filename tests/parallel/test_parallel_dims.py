"""The device grid's rank layout and its up-front shape checks (no processes needed)."""

from __future__ import annotations

import itertools

import pytest

from parallel.parallel_dims import ParallelDims
from parallel_plan.llama_shapes import check_parallel_shapes
from tests.model.model_helpers import small_config


@pytest.mark.parametrize("sizes, first_groups", [
    (dict(tensor_parallel=2, pipeline_parallel=2),  # the docstring's first worked example
     {"tp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]], "pp": [[0, 4], [1, 5]]}),
    (dict(tensor_parallel=2, context_parallel=2),  # its second: D = 2, C = 2, T = 2
     {"cp": [[0, 2], [1, 3]], "dp": [[0, 4], [1, 5]], "dp_cp": [[0, 2, 4, 6], [1, 3, 5, 7]]}),
], ids=["tp2_pp2", "cp2_tp2"])
def test_groups_partition_ranks_and_agree_with_coordinates(sizes, first_groups):
    dims = ParallelDims(world_size=8, **sizes)
    assert dims.data_parallel == 2
    groups = dims.group_ranks()
    for dimension, expected in first_groups.items():
        assert groups[dimension][:2] == expected, dimension
    axes = ("pp", "dp", "cp", "tp")  # the order of `coordinates`
    for dimension in ("pp", "dp", "cp", "tp", "dp_cp"):
        varying = [axes.index(axis) for axis in dimension.split("_")]
        assert sorted(itertools.chain(*groups[dimension])) == list(range(8))
        for ranks in groups[dimension]:  # inside a group only its coordinates change
            coords = [dims.coordinates(rank) for rank in ranks]
            assert len({tuple(c[i] for i in varying) for c in coords}) == len(ranks)
            assert len({tuple(c[i] for i in range(4) if i not in varying)
                        for c in coords}) == 1
    for rank in range(8):
        assert dims.rank_of(*dims.coordinates(rank)) == rank


@pytest.mark.parametrize("kwargs, message", [
    (dict(world_size=6, tensor_parallel=4), "world size 6 is not divisible"),
    (dict(world_size=4, tensor_parallel=4), "num_key_value_heads 2"),
    (dict(world_size=3, pipeline_parallel=3), "num_hidden_layers 2"),
    (dict(world_size=2, sequence_parallel=True), "--sequence_parallel needs"),
    (dict(world_size=2, tensor_parallel=2, sequence_parallel=True, seq_len=9),
     "sequence length 9"),
    (dict(world_size=4, context_parallel=3), "world size 4 is not divisible by "
     "--tensor_parallel 1 x --pipeline_parallel 1 x --context_parallel 3"),
    (dict(world_size=2, context_parallel=2, seq_len=6), "--max_seq_len 6 is not divisible by "
     "2 x --context_parallel 2 = 4"),
])
def test_shape_check_names_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_parallel_shapes(small_config("gqa"), **kwargs)


def test_shape_check_accepts_a_valid_grid():
    check_parallel_shapes(small_config("gqa"), world_size=8, tensor_parallel=2,
                          pipeline_parallel=2, sequence_parallel=True, seq_len=16)
