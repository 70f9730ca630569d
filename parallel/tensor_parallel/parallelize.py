"""`parallelize_model`: turn a built z2all model into its tensor-parallel form, in place.

Every rank builds the same full model (same seed or the same checkpoint), then keeps only its
slices (sharding.py). Per decoder block (torchtitan's `parallelize_llama` is the pattern):

    input_layernorm          replicated, or SequenceParallelRMSNorm (gathers its output)
    self_attn.qkv_proj       ColumnParallelLinear   (H/T query heads, KV/T key/value heads)
    self_attn.o_proj         RowParallelLinear      (all-reduce / reduce-scatter)
    post_attention_layernorm as input_layernorm
    mlp.gate_up_proj         ColumnParallelLinear   (I/T gate and I/T up units)
    mlp.down_proj            RowParallelLinear

plus VocabParallelEmbedding, the final norm, and VocabParallelLMHead (tied embeddings stay one
Parameter: both hold the same vocabulary slice). Parameter names do not change, so a layout-
neutral checkpoint can address them by their unsharded names. Works on a pipeline stage too
(parts the stage does not hold are skipped).
"""

from __future__ import annotations

from torch import nn

from model.modeling_z2all import Z2allForCausalLM
from model.rms_norm import RMSNorm
from parallel.parallel_dims import ParallelDims
from parallel.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    SequenceParallelRMSNorm,
    VocabParallelEmbedding,
    VocabParallelLMHead,
)
from parallel.tensor_parallel.sharding import layout_for, shard_tensor


def parallelize_model(model: Z2allForCausalLM, dims: ParallelDims,
                      sequence_parallel: bool = False) -> Z2allForCausalLM:
    """Shard `model` over `dims.tp_group` in place and return it."""
    config, group = model.config, dims.tp_group
    rank, size = dims.tp_rank, dims.tensor_parallel

    def local_slice(name: str, weight: nn.Parameter):
        return shard_tensor(weight.detach(), layout_for(name, config), rank, size)

    def norm(module: RMSNorm) -> nn.Module:
        if not sequence_parallel:
            return module
        return SequenceParallelRMSNorm(module.weight.detach(), module.eps, group)

    for block in model.model.layers.children():
        attention, mlp = block.self_attn, block.mlp
        attention.qkv_proj = ColumnParallelLinear(
            local_slice("qkv_proj.weight", attention.qkv_proj.weight), group, sequence_parallel)
        attention.o_proj = RowParallelLinear(
            local_slice("o_proj.weight", attention.o_proj.weight), group, sequence_parallel)
        attention.num_heads //= size
        attention.num_kv_heads //= size
        mlp.gate_up_proj = ColumnParallelLinear(
            local_slice("gate_up_proj.weight", mlp.gate_up_proj.weight), group,
            sequence_parallel)
        mlp.down_proj = RowParallelLinear(
            local_slice("down_proj.weight", mlp.down_proj.weight), group, sequence_parallel)
        block.input_layernorm = norm(block.input_layernorm)
        block.post_attention_layernorm = norm(block.post_attention_layernorm)

    vocab_start = rank * config.vocab_size // size
    if model.model.embed_tokens is not None:
        model.model.embed_tokens = VocabParallelEmbedding(
            local_slice("embed_tokens.weight", model.model.embed_tokens.weight), vocab_start,
            group, sequence_parallel)
    if model.model.norm is not None:
        model.model.norm = norm(model.model.norm)
    if model.lm_head is not None:
        embedding = model.model.embed_tokens
        tied = config.tie_word_embeddings and embedding is not None
        model.lm_head = VocabParallelLMHead(
            embedding.weight if tied else local_slice("lm_head.weight", model.lm_head.weight),
            vocab_start, group, sequence_parallel)
        if tied:
            model.lm_head.weight = embedding.weight  # one Parameter, as in tie_weights()
    return model
