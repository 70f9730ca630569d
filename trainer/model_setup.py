"""Where the trainer's model comes from: a checkpoint to resume, an init to fine-tune, or a
fresh preset (with the command line's overrides)."""

from __future__ import annotations

from pathlib import Path

from model.configuration_z2all import Z2allConfig
from model.loading import load_model
from model.modeling_z2all import Z2allForCausalLM
from trainer.options import ModelOptions

# Options of the trainer that override fields of the model preset when set.
MODEL_OVERRIDES = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "intermediate_size", "dropout")


def preset_model_config(options: ModelOptions, max_seq_len: int, vocab_size: int
                        ) -> Z2allConfig:
    """`--model_preset` with the command line's overrides; raises ValueError on a bad shape."""
    overrides = {name: getattr(options, name) for name in MODEL_OVERRIDES
                 if getattr(options, name) is not None}
    return Z2allConfig.from_preset(options.model_preset, vocab_size=vocab_size,
                                   max_position_embeddings=max_seq_len, **overrides)


def build_model(options: ModelOptions, max_seq_len: int, tokenizer_size: int,
                resume_dir: Path | None) -> Z2allForCausalLM:
    """The model to train: resumed > init_from > a fresh `model_preset` sized for the data."""
    if resume_dir is not None:
        model = Z2allForCausalLM.from_pretrained(resume_dir)
    elif options.init_from:
        model, _ = load_model(options.init_from)
    else:
        config = preset_model_config(options, max_seq_len, tokenizer_size)
        config.activation_checkpointing = options.activation_checkpointing
        return Z2allForCausalLM(config)
    if model.config.vocab_size < tokenizer_size:
        raise ValueError(f"the model's vocabulary ({model.config.vocab_size}) is smaller than the "
                         f"tokenizer's ({tokenizer_size}): wrong --tokenizer_dir for this model?")
    if model.config.max_position_embeddings < max_seq_len:
        raise ValueError(f"--max_seq_len={max_seq_len} exceeds the model's "
                         f"max_position_embeddings={model.config.max_position_embeddings}")
    model.config.activation_checkpointing = options.activation_checkpointing
    return model
