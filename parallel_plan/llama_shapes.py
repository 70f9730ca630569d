"""What our llama's shapes allow on a device grid: the checks that need the model config.

Tensor parallelism splits the attention heads, the key/value heads and the MLP's hidden units
into T equal parts (the vocabulary too, padded to a multiple of T:
parallel/tensor_parallel/sharding.py); a pipeline cuts the decoder blocks into P equal stages.
Dropout is refused where ranks would have to draw the same mask from one RNG stream (the
replicated regions of tensor parallelism) or where the kernel has none (ring attention). The
grid's own sizes (world size, sequence length) are checked by parallel/parallel_dims.py's
`check_grid`, which this calls first.
"""

from __future__ import annotations

from model.configuration_z2all import Z2allConfig
from parallel.parallel_dims import check_grid


def check_parallel_shapes(config: Z2allConfig, world_size: int, tensor_parallel: int = 1,
                          pipeline_parallel: int = 1, sequence_parallel: bool = False,
                          seq_len: int | None = None, context_parallel: int = 1) -> None:
    """Raise ValueError (one line naming the option) if the model cannot be split this way."""
    check_grid(world_size, tensor_parallel, pipeline_parallel, sequence_parallel, seq_len,
               context_parallel)
    t = tensor_parallel
    for name, size in (("num_attention_heads", config.num_attention_heads),
                       ("num_key_value_heads", config.num_key_value_heads),
                       ("intermediate_size", config.intermediate_size)):
        if size % t:  # (the vocabulary need not be: it is padded, tensor_parallel/sharding.py)
            raise ValueError(f"model {name} {size} is not divisible by --tensor_parallel {t}")
    if t > 1 and config.dropout:
        raise ValueError(f"dropout {config.dropout} with --tensor_parallel {t} is not "
                         "supported (replicated regions would need one RNG stream); use 0")
    if context_parallel > 1 and config.dropout:
        raise ValueError(f"dropout {config.dropout} with --context_parallel {context_parallel} "
                         "is not supported (ring attention has no dropout); use 0")
    if config.num_hidden_layers % pipeline_parallel:
        raise ValueError(f"model num_hidden_layers {config.num_hidden_layers} is not divisible "
                         f"by --pipeline_parallel {pipeline_parallel}")
