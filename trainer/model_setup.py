"""Where the trainer's model comes from: a checkpoint to resume, an init to fine-tune (in full,
or frozen with LoRA adapters: model/lora.py), or a fresh preset (with the command line's
overrides); and the tokenizer that belongs to it.

A model's ids mean nothing with another tokenizer (model/run_tokenizer.py), so the run's
tokenizer is settled before any data is read:

    --tokenizer_dir given       that one, checked against the --init_from / resumed model
    left out, with --init_from  that model's own (an HF dir's, a run's tokenizer/ copy)
    left out, fresh model       tokenizer/demo_hf

and recorded in config.json as an absolute path (so the run works from any directory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dataset.data_config import DataConfig
from model.configuration_z2all import Z2allConfig, read_config_json
from model.hf_llama_mapping import config_from_hf
from model.loading import (
    is_hf_model_dir,
    load_lora_checkpoint,
    load_model,
    lora_base_reference,
    resolve_model_dir,
)
from model.lora import LoraConfig, apply_lora
from model.lora_checkpoint import is_lora_checkpoint, read_lora_checkpoint
from model.modeling_z2all import CONFIG_FILE, Z2allForCausalLM
from model.run_tokenizer import check_tokenizer_matches, default_tokenizer_dir
from tokenizer import load_tokenizer
from trainer.options import ModelOptions
from utils.tokenizer_protocol import Tokenizer

DEMO_TOKENIZER_DIR = "tokenizer/demo_hf"
# Options of the trainer that override fields of the model preset when set.
MODEL_OVERRIDES = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "intermediate_size", "dropout")


def run_tokenizer(data: DataConfig, init_from: str | None, run_dir: Path,
                  resume_dir: Path | None) -> Any:
    """The run's tokenizer, refused in one line if it is not the model's (see the module
    docstring); sets `data.tokenizer_dir` to its absolute path, as config.json records it."""
    # The model the run continues (--resume) or starts from (--init_from), if any.
    model_source, model_dir = str(run_dir), resume_dir
    if resume_dir is None:
        model_source, model_dir = init_from, init_from and resolve_model_dir(init_from)
    own_dir = model_dir and default_tokenizer_dir(model_source, model_dir)
    if data.tokenizer_dir is None:
        if model_dir and own_dir is None:
            raise ValueError(f"{model_source} has no tokenizer of its own (none next to the "
                             "weights, no tokenizer/ in its run): pass --tokenizer_dir")
        data.tokenizer_dir = own_dir or DEMO_TOKENIZER_DIR
    data.tokenizer_dir = str(Path(data.tokenizer_dir).absolute())
    tokenizer = load_tokenizer(data.tokenizer_dir)
    if model_dir:
        expected = None if own_dir is None else load_tokenizer(own_dir).fingerprint
        check_tokenizer_matches(model_config_at(model_dir), tokenizer, model_source, expected)
    return tokenizer


def model_config_at(model_dir: Path) -> Z2allConfig:
    """The config of the model whose weights are in `model_dir` (as `resolve_model_dir` names
    it), without reading the weights; a LoRA checkpoint's is its base's."""
    if is_lora_checkpoint(model_dir):
        return model_config_at(resolve_model_dir(read_lora_checkpoint(model_dir)[1]["path"]))
    if is_hf_model_dir(model_dir):
        return config_from_hf(read_config_json(model_dir / CONFIG_FILE),
                              source=str(model_dir / CONFIG_FILE))
    return Z2allConfig.from_json_file(model_dir / CONFIG_FILE)


def preset_model_config(options: ModelOptions, max_seq_len: int, vocab_size: int
                        ) -> Z2allConfig:
    """`--model_preset` with the command line's overrides; raises ValueError on a bad shape."""
    overrides = {name: getattr(options, name) for name in MODEL_OVERRIDES
                 if getattr(options, name) is not None}
    return Z2allConfig.from_preset(options.model_preset, vocab_size=vocab_size,
                                   max_position_embeddings=max_seq_len, **overrides)


def planned_model_config(options: ModelOptions, max_seq_len: int, tokenizer: Tokenizer,
                         resume_dir: Path | None) -> Z2allConfig:
    """The config of the model `build_model` will build, read without building it (for the
    memory plan, before any memory is taken)."""
    source = resume_dir or (options.init_from and resolve_model_dir(options.init_from))
    if source:
        return model_config_at(Path(source))
    return preset_model_config(options, max_seq_len, len(tokenizer))


def build_model(options: ModelOptions, max_seq_len: int, tokenizer: Tokenizer,
                lora: LoraConfig | None, resume_dir: Path | None
                ) -> tuple[Z2allForCausalLM, dict[str, str] | None]:
    """(the model to train, the LoRA base reference or None): resumed > init_from > a fresh
    `model_preset` sized for the tokenizer. With LoRA the base is recorded (path, weights and
    tokenizer fingerprints, the config fields that decide its function:
    model/lora_checkpoint.py) before adapters go on; a resume records it as verified now."""
    base_reference = None
    if resume_dir is not None and is_lora_checkpoint(resume_dir):
        model, saved_lora, base_reference = load_lora_checkpoint(resume_dir)
        if saved_lora != lora:
            raise ValueError(f"{resume_dir} holds LoRA adapters {saved_lora}, the options ask "
                             f"for {lora}")
    elif resume_dir is not None:
        model = Z2allForCausalLM.from_pretrained(resume_dir)
    elif options.init_from:
        model, model_dir = load_model(options.init_from)
        if lora is not None:
            base_reference = lora_base_reference(model, model_dir)  # before any dtype cast
            apply_lora(model, lora)
    else:
        config = preset_model_config(options, max_seq_len, len(tokenizer))
        model = Z2allForCausalLM(config)
    if model.config.max_position_embeddings < max_seq_len:
        raise ValueError(f"--max_seq_len={max_seq_len} exceeds the model's "
                         f"max_position_embeddings={model.config.max_position_embeddings}")
    model.config.activation_checkpointing = options.activation_checkpointing
    if resume_dir is None:  # the model records its tokenizer from its first checkpoint on
        model.config.tokenizer_fingerprint = tokenizer.fingerprint
    return model, base_reference
