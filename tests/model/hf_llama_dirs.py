"""Tiny random HF Llama-family model directories, saved by transformers itself: Llama-2,
Llama-3 RoPE scaling, linear scaling, tied embeddings (SmolLM-style), an explicit head_dim
and MQA. The model tests check our loading and export against them, the grid tests train
them on tensor/pipeline grids."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

HF_VOCAB = 300
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 100.0, "factor": 4.0,
               "low_freq_factor": 2.0, "high_freq_factor": 8.0,
               "original_max_position_embeddings": 64}
# name: LlamaConfig overrides. head_dim 16 and theta 100 give wavelengths 6.3, 11, 20, 35, ...
# so the llama3 rule keeps one frequency, mixes two and divides the rest (model/rope.py).
VARIANTS = {
    "llama2": dict(num_key_value_heads=4),
    "llama3": dict(num_key_value_heads=2, rope_parameters=LLAMA3_ROPE),
    "linear": dict(num_key_value_heads=2, rope_parameters={"rope_type": "linear",
                                                           "rope_theta": 300.0, "factor": 2.0}),
    "tied": dict(num_key_value_heads=2, tie_word_embeddings=True),
    "head_dim": dict(num_key_value_heads=2, head_dim=24),
    "mqa": dict(num_key_value_heads=1),
}


def random_hf_dir(tmp_path: Path, variant: str, seed: int = 0, vocab_size: int = HF_VOCAB,
                  **save_options) -> tuple[LlamaForCausalLM, Path]:
    """(a random 2-layer `LlamaForCausalLM` of `variant`, the directory it was saved to)."""
    torch.manual_seed(seed)
    values = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                  num_attention_heads=4, rms_norm_eps=1e-6, max_position_embeddings=256,
                  initializer_range=0.1, tie_word_embeddings=False)
    hf_model = LlamaForCausalLM(LlamaConfig(**{**values, **VARIANTS[variant]})).eval()
    directory = tmp_path / f"hf_{variant}"
    hf_model.save_pretrained(directory, **save_options)
    return hf_model, directory
