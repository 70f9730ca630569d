"""ZeRO-2/3's units for our llama: which submodules are gathered, freed and reduced as one.

One unit per decoder block (a block's weights are used together, once per forward and once per
backward), the rest (embedding, final norm, head) in the root unit. On a pipeline, a tied
embedding's copy gets a unit of its own, so that the first and the last stage cut it into the
same shards and can sum their gradients (parallel/sharded_data_parallel/, `with_owner_of`).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from model.modeling_z2all import DecoderBlock, Z2allForCausalLM
from parallel.parallel_dims import ParallelDims
from parallel.sharded_data_parallel import with_owner_of
from parallel_plan.llama_pipeline import tied_embedding_param


def is_decoder_block(module: nn.Module) -> bool:
    return isinstance(module, DecoderBlock)


def zero_units(model: Z2allForCausalLM, dims: ParallelDims | None = None
               ) -> Callable[[nn.Module], bool]:
    """The unit boundaries of `model` (on a grid: of this rank's stage)."""
    shared = tied_embedding_param(model, dims) if dims is not None else None
    return with_owner_of(is_decoder_block, shared)
