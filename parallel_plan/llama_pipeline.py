"""Our llama cut into pipeline stages: this rank's consecutive slice of the decoder blocks, and
its forward composed of the model's own parts (embedding, RoPE and attention layout, blocks,
norm and head), so a stage computes exactly what the whole model does.

With P stages and L layers, stage s keeps blocks [s L/P, (s+1) L/P), the first stage also the
embedding, the last the final norm and the head (which computes the loss). Worked example,
L=4, P=2:

    stage 0:  embed_tokens, layers 0 1            --hidden [B, S, H]-->
    stage 1:                layers 2 3, norm, lm_head -> loss

Blocks are kept in an `nn.ModuleDict` keyed by their layer number, so parameter names stay those
of the whole model (`model.layers.2.mlp...` on stage 1): checkpoints address parameters by the
unsharded names whatever the grid. A tied embedding is the weight two stages share
(parallel/pipeline_parallel/stage.py sums its two copies' gradients).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from model.modeling_z2all import Z2allForCausalLM
from parallel.parallel_dims import ParallelDims
from parallel.pipeline_parallel.stage import PipelineStage


def split_into_stage(model: Z2allForCausalLM, dims: ParallelDims) -> Z2allForCausalLM:
    """Keep only this rank's stage of `model`, in place (other parts become None)."""
    layers_per_stage = model.config.num_hidden_layers // dims.pipeline_parallel
    first = dims.pp_rank * layers_per_stage
    kept = range(first, first + layers_per_stage)
    model.model.layers = nn.ModuleDict({str(index): model.model.layers[index]
                                        for index in kept})
    if not dims.is_first_stage:
        model.model.embed_tokens = None
    if not dims.is_last_stage:
        model.model.norm = None
        model.lm_head = None
    return model


def tied_embedding_param(model: Z2allForCausalLM, dims: ParallelDims) -> nn.Parameter | None:
    """This stage's copy of a tied embedding split over two stages, else None."""
    if not model.config.tie_word_embeddings or dims.pipeline_parallel == 1:
        return None
    if dims.is_first_stage:
        return model.model.embed_tokens.weight
    if dims.is_last_stage:
        return model.lm_head.weight
    return None


def stage_forward(model: Z2allForCausalLM, dims: ParallelDims, stage_input: torch.Tensor | None,
                  micro_batch: dict[str, torch.Tensor], per_token: bool = False) -> torch.Tensor:
    """Hidden states for the next stage, or on the last stage the micro-batch's mean loss
    (`per_token`: its token log-probs [B, S], as `Z2allForCausalLM.token_log_probs`, for DPO).
    The model's own parts (`Z2allModel.forward` composes the same ones), those this stage
    holds: positions, RoPE and attention layout come from the whole micro-batch, whatever
    part of the sequence `hidden` holds under sequence or context parallelism."""
    inner, input_ids = model.model, micro_batch["input_ids"]
    hidden = inner.embed(input_ids) if dims.is_first_stage else stage_input
    inputs = inner.block_inputs(micro_batch.get("attention_mask"), input_ids.shape[1], 0,
                                hidden)
    hidden = inner.run_blocks(hidden, inputs)
    if not dims.is_last_stage:
        return hidden
    return model.head_loss(inner.norm(hidden), micro_batch["labels"], per_token)


def llama_stage(model: Z2allForCausalLM, dims: ParallelDims) -> PipelineStage:
    """What the schedule drives: `model` already cut to this rank's stage (and sliced)."""
    return PipelineStage(module=model, forward=functools.partial(stage_forward, model, dims),
                         hidden_size=model.config.hidden_size,
                         shared_param=tied_embedding_param(model, dims))
