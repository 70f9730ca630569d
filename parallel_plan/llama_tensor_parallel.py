"""Our llama under tensor parallelism: which weight is split how (`layout_for`), and
`parallelize_model`, which turns a built model into its tensor-parallel form, in place.

Every rank builds the same full model (same seed or the same checkpoint), then keeps only its
slices (parallel/tensor_parallel/sharding.py). Per decoder block (torchtitan's
`parallelize_llama` is the pattern):

    input_layernorm          replicated, or SequenceParallelNorm (gathers its output)
    self_attn.qkv_proj       ColumnParallelLinear   (H/T query heads, KV/T key/value heads)
    self_attn.o_proj         RowParallelLinear      (all-reduce / reduce-scatter)
    post_attention_layernorm as input_layernorm
    mlp.gate_up_proj         ColumnParallelLinear   (I/T gate and I/T up units)
    mlp.down_proj            RowParallelLinear

plus VocabParallelEmbedding, the final norm, and VocabParallelLMHead (tied embeddings stay one
Parameter: both hold the same vocabulary slice). A projection that carries LoRA adapters
(model/lora.py) becomes the column- or row-parallel LoraLinear instead, its adapters sliced
like its weight (tensor_parallel_lora.py). Parameter names do not change, so a layout-neutral
checkpoint can address them by their unsharded names. Works on a pipeline stage too (parts the
stage does not hold are skipped).

The layouts: the fused q|k|v rows and gate|up rows are split block by block (column-parallel),
`o_proj` / `down_proj` along their input dimension (row-parallel: rank r's columns match the
heads / hidden units it computed), embedding and head by vocabulary rows; norm weights are
replicated (no layout). LoRA adapters (model/lora.py: `lora_A.<HF projection>` [r, in],
`lora_B.<projection>` [rows, r]) are split like their base weight, so that B A is this rank's
slice of the update: where the base's rows are split (q/k/v, gate/up) each B keeps the rows of
its projection's chunk and A is whole; where its columns are (o, down) A keeps the input
columns and B is whole.
"""

from __future__ import annotations

import torch
from torch import nn

from model import kernels
from model.configuration_z2all import Z2allConfig
from model.lora import LoraLinear
from model.modeling_z2all import Z2allForCausalLM
from model.rms_norm import RMSNorm
from parallel.parallel_dims import ParallelDims
from parallel.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    SequenceParallelNorm,
    VocabParallelEmbedding,
    VocabParallelLMHead,
)
from parallel.tensor_parallel.sharding import LayoutOf, ShardLayout, padded_size, shard_tensor
from parallel_plan.tensor_parallel_lora import ColumnParallelLoraLinear, RowParallelLoraLinear


def layout_for(param_name: str, config: Z2allConfig) -> ShardLayout | None:
    """How the unsharded parameter `param_name` is split (None: replicated on every rank)."""
    q_rows = config.num_attention_heads * config.head_dim
    kv_rows = config.num_key_value_heads * config.head_dim
    intermediate = config.intermediate_size
    layouts = {
        "qkv_proj.weight": ShardLayout(0, (q_rows, kv_rows, kv_rows)),
        "o_proj.weight": ShardLayout(1, (q_rows,)),
        "gate_up_proj.weight": ShardLayout(0, (intermediate,) * 2),
        "down_proj.weight": ShardLayout(1, (intermediate,)),
        "embed_tokens.weight": ShardLayout(0, (config.vocab_size,)),
        "lm_head.weight": ShardLayout(0, (config.vocab_size,)),
    }
    # LoRA (module docstring): B's rows where the base's rows are split, A's columns where its
    # columns are; the other factor is replicated (no entry).
    split_rows = {"q_proj": q_rows, "k_proj": kv_rows, "v_proj": kv_rows,
                  "gate_proj": intermediate, "up_proj": intermediate}
    split_columns = {"o_proj": q_rows, "down_proj": intermediate}
    layouts |= {f"lora_B.{name}": ShardLayout(0, (rows,)) for name, rows in split_rows.items()}
    layouts |= {f"lora_A.{name}": ShardLayout(1, (columns,))
                for name, columns in split_columns.items()}
    suffix = ".".join(param_name.split(".")[-2:])
    return layouts.get(suffix)


def layouts_of(config: Z2allConfig) -> LayoutOf:
    """`layout_for` bound to one model's config: what layout-neutral checkpoints take."""
    return lambda name: layout_for(name, config)


def parallelize_model(model: Z2allForCausalLM, dims: ParallelDims,
                      sequence_parallel: bool = False) -> Z2allForCausalLM:
    """Shard `model` over `dims.tp_group` in place and return it. A frozen parameter (a LoRA
    base's) stays frozen in its new module."""
    config, group = model.config, dims.tp_group
    rank, size = dims.tp_rank, dims.tensor_parallel
    frozen = {name for name, param in model.named_parameters() if not param.requires_grad}

    def local_slice(name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the whole `tensor` (itself where `name` is replicated)."""
        layout = layout_for(name, config)
        tensor = tensor.detach()
        return tensor if layout is None else shard_tensor(tensor, layout, rank, size)

    def split(layer: nn.Module, name: str, plain: type, with_lora: type) -> nn.Module:
        """The projection `name` (e.g. "qkv_proj") as `plain`, or `with_lora` if adapted."""
        if isinstance(layer, LoraLinear):
            return with_lora(layer, lambda tensor_name, tensor: local_slice(
                f"{name}.{tensor_name}", tensor), group, sequence_parallel)
        return plain(local_slice(f"{name}.weight", layer.weight), group, sequence_parallel)

    def norm(module: RMSNorm) -> nn.Module:
        if not sequence_parallel:
            return module
        return SequenceParallelNorm(module.weight.detach(), module.eps, group, kernels.rms_norm)

    column = (ColumnParallelLinear, ColumnParallelLoraLinear)
    row = (RowParallelLinear, RowParallelLoraLinear)
    for block in model.model.layers.children():
        attention, mlp = block.self_attn, block.mlp
        attention.qkv_proj = split(attention.qkv_proj, "qkv_proj", *column)
        attention.o_proj = split(attention.o_proj, "o_proj", *row)
        attention.num_heads //= size
        attention.num_kv_heads //= size
        mlp.gate_up_proj = split(mlp.gate_up_proj, "gate_up_proj", *column)
        mlp.down_proj = split(mlp.down_proj, "down_proj", *row)
        block.input_layernorm = norm(block.input_layernorm)
        block.post_attention_layernorm = norm(block.post_attention_layernorm)

    vocab_start = rank * padded_size(config.vocab_size, size) // size  # (sharding.py)
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
            vocab_start, group, sequence_parallel, config.vocab_size)
        if tied:
            model.lm_head.weight = embedding.weight  # one Parameter, as in tie_weights()
    for name, param in model.named_parameters():  # (the new modules made fresh Parameters)
        param.requires_grad_(name not in frozen)
    return model
