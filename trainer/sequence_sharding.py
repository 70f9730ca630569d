"""Context parallelism set up in the trainer: the grid's context-parallel group becomes the
model's `SequenceShard` (model/sequence_shard.py), implemented by ring attention
(parallel/context_parallel/context_shard.py). Nothing else of the run changes: the gradients are
averaged, and every ZeRO stage shards, over the dp x cp group (docs/design.md section 8.4a).
"""

from __future__ import annotations

from model.modeling_z2all import Z2allForCausalLM
from parallel.context_parallel.context_shard import ContextShard
from parallel.parallel_dims import ParallelDims


def shard_sequences(model: Z2allForCausalLM, dims: ParallelDims) -> ContextShard | None:
    """Context parallelism's one change to the model: from now on it computes this rank's share
    of every sequence it is given (parallel/context_parallel/context_shard.py); None when the
    grid has no context-parallel dimension."""
    if dims.context_parallel == 1:
        return None
    context = ContextShard.of(dims.cp_group)
    model.use_sequence_shard(context)
    return context
