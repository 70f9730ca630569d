"""Where the trainer's model comes from: a checkpoint to resume, an init to fine-tune (in full,
or frozen with LoRA adapters: model/lora.py), or a fresh preset (with the command line's
overrides); and the tokenizer that belongs to it.

A model's ids mean nothing with another tokenizer (model/run_tokenizer.py), so the run's
tokenizer is settled before any data is read:

    --tokenizer_dir given       that one, checked against the --init_from / resumed model
    left out, with --init_from  that model's own (an HF dir's, a run's tokenizer/ copy)
    left out, fresh model       tokenizer/demo_hf

and recorded in config.json as an absolute path (so the run works from any directory).

The model a run continues or starts from is resolved once, by rank 0 for every rank: the
--init_from model by `trainer.option_validation.check_init_from` when the options are checked
(which directory holds its weights, after a checkpoint's manifest verifies, and its config),
the resumed checkpoint by `resumed_source`; that `ModelSource` is what the tokenizer check,
the memory plan and the model build read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataset.data_config import DataConfig
from model.configuration_z2all import Z2allConfig
from model.loading import (
    ModelFiles,
    load_lora_checkpoint,
    load_model_at,
    lora_base_reference,
    model_files_at,
)
from model.lora import LoraConfig, apply_lora
from model.lora_checkpoint import is_lora_checkpoint
from model.modeling_z2all import Z2allForCausalLM
from model.run_tokenizer import check_tokenizer_matches, default_tokenizer_dir
from tokenizer import load_tokenizer
from trainer.options import ModelOptions
from utils.tokenizer_protocol import Tokenizer

DEMO_TOKENIZER_DIR = "tokenizer/demo_hf"
# Options of the trainer that override fields of the model preset when set.
MODEL_OVERRIDES = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "intermediate_size", "dropout")


@dataclass(frozen=True)
class ModelSource:
    """The model a run continues (--resume) or starts from (--init_from), resolved once."""

    name: str         # as messages name it: the run dir on --resume, else --init_from
    directory: Path   # whose weights are read (model/loading.py `resolve_model_dir`)
    files: ModelFiles  # its config and weight files, read without the weights

    @property
    def config(self) -> Z2allConfig:
        return self.files.config


def resumed_source(run_dir: Path, resume_dir: Path | None) -> ModelSource | None:
    """The checkpoint a --resume continues (named by its run), or None."""
    if resume_dir is None:
        return None
    return ModelSource(str(run_dir), resume_dir, model_files_at(resume_dir))


def run_tokenizer(data: DataConfig, source: ModelSource | None) -> Any:
    """The run's tokenizer, refused in one line if it is not the model's (see the module
    docstring); sets `data.tokenizer_dir` to its absolute path, as config.json records it."""
    own_dir = source and default_tokenizer_dir(source.name, source.directory)
    if data.tokenizer_dir is None:
        if source and own_dir is None:
            raise ValueError(f"{source.name} has no tokenizer of its own (none next to the "
                             "weights, no tokenizer/ in its run): pass --tokenizer_dir")
        data.tokenizer_dir = own_dir or DEMO_TOKENIZER_DIR
    data.tokenizer_dir = str(Path(data.tokenizer_dir).absolute())
    tokenizer = load_tokenizer(data.tokenizer_dir)
    if source:
        expected = None if own_dir is None else load_tokenizer(own_dir).fingerprint
        check_tokenizer_matches(source.config, tokenizer, source.name, expected)
    return tokenizer


def preset_model_config(options: ModelOptions, max_seq_len: int, vocab_size: int
                        ) -> Z2allConfig:
    """`--model_preset` with the command line's overrides; raises ValueError on a bad shape."""
    overrides = {name: getattr(options, name) for name in MODEL_OVERRIDES
                 if getattr(options, name) is not None}
    return Z2allConfig.from_preset(options.model_preset, vocab_size=vocab_size,
                                   max_position_embeddings=max_seq_len, **overrides)


def planned_model_config(options: ModelOptions, max_seq_len: int, tokenizer: Tokenizer,
                         source: ModelSource | None) -> Z2allConfig:
    """The config of the model `build_model` will build, read without building it (for the
    memory plan, before any memory is taken)."""
    if source:
        return source.config
    return preset_model_config(options, max_seq_len, len(tokenizer))


def build_model(options: ModelOptions, max_seq_len: int, tokenizer: Tokenizer,
                lora: LoraConfig | None, resume_dir: Path | None, init: ModelSource | None
                ) -> tuple[Z2allForCausalLM, dict[str, str] | None]:
    """(the model to train, the LoRA base reference or None): resumed > `init` (--init_from,
    resolved) > a fresh `model_preset` sized for the tokenizer. With LoRA the base is
    recorded (path, weights and tokenizer fingerprints, the config fields that decide its
    function: model/lora_checkpoint.py) before adapters go on; a resume records it as
    verified now."""
    base_reference = None
    if resume_dir is not None and is_lora_checkpoint(resume_dir):
        model, saved_lora, base_reference = load_lora_checkpoint(resume_dir)
        if saved_lora != lora:
            raise ValueError(f"{resume_dir} holds LoRA adapters {saved_lora}, the options ask "
                             f"for {lora}")
    elif resume_dir is not None:
        model = Z2allForCausalLM.from_pretrained(resume_dir)
    elif init is not None:
        model = load_model_at(init.directory)
        if lora is not None:
            base_reference = lora_base_reference(model, init.directory)  # before any dtype cast
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
