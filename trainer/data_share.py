"""Which part of each global batch a rank reads, on any layout (data parallelism alone, or a
tensor/pipeline/context grid: parallel/parallel_dims.py): the ranks of one data-parallel replica
read the same batches, split by their data-parallel rank, and one of them (the replica's data
leader) counts the tokens and holds the replica's data state in a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parallel.parallel_dims import ParallelDims


@dataclass(frozen=True)
class DataShare:
    """Which part of each global batch this rank reads: on a grid the T x P x C ranks of one
    data-parallel replica read the same batches (with context parallelism each then computes
    its share of every sequence: parallel/context_parallel/context_shard.py), and one of them
    counts their tokens. `sequence_multiple`: every batch's length is a multiple of it (2C:
    context parallelism cuts each sequence into 2C equal chunks)."""

    rank: int
    world_size: int
    counts_tokens: bool
    sequence_multiple: int = 1


def data_share(rank: int, world_size: int, tensor_parallel: int, pipeline_parallel: int,
               context_parallel: int = 1) -> DataShare:
    """ValueError (one line) when the world does not divide into the grid."""
    dims = ParallelDims(world_size, tensor_parallel, pipeline_parallel, context_parallel,
                        rank=rank)
    counts_tokens = dims.tp_rank == 0 and dims.pp_rank == 0 and dims.cp_rank == 0
    return DataShare(dims.dp_rank, dims.data_parallel, counts_tokens,
                     sequence_multiple=2 * context_parallel if context_parallel > 1 else 1)


def data_leader_ranks(world_size: int, tensor_parallel: int, pipeline_parallel: int,
                      context_parallel: int = 1) -> list[int]:
    """One global rank per data-parallel replica, in dp order (their data states are the
    replicas'; the other ranks of a replica hold copies)."""
    dims = ParallelDims(world_size, tensor_parallel, pipeline_parallel, context_parallel)
    return [dims.rank_of(0, dp, 0, 0) for dp in range(dims.data_parallel)]


def saved_data_leader_ranks(trainer_state: dict[str, Any]) -> list[int]:
    """`data_leader_ranks` of the grid a checkpoint was saved on (from its trainer state, so a
    run resumed on another grid reads the right ranks' data states)."""
    saved = trainer_state["config"]
    return data_leader_ranks(trainer_state["world_size"], saved.get("tensor_parallel", 1),
                             saved.get("pipeline_parallel", 1), saved.get("context_parallel", 1))
