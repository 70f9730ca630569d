"""`Z2allConfig`: every shape and knob of the llama2-style model, with HF Llama's names.

The field names are those of `transformers.LlamaConfig`, so converting a checkpoint to or from
Hugging Face is a dictionary copy (see `model/convert_to_hf.py`). A config is saved next to the
weights as `config.json` and read back with `Z2allConfig.from_json_file`.

Presets (`Z2allConfig.from_preset(name, **overrides)`), parameter counts with vocab 32000:

    name   hidden  layers  heads  kv_heads  intermediate  tied   parameters
    tiny      128       4      4         2           512  yes    1.5 M (vocab 4096; CPU tests)
    0.1B      768      12     12        12          2048  yes    0.11 B (GPT-2-small-sized)
    0.5B     1280      24     20         4          3584  yes    0.47 B
    1.7B     2048      28     16         8          7168  no     1.72 B
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import Any

from utils.atomic_io import atomic_write_json


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= `value`."""
    return multiple * math.ceil(value / multiple)


@dataclass
class Z2allConfig:
    vocab_size: int = 32000
    """Embedding rows; rounded up to a multiple of `vocab_size_multiple` (tensor-core friendly
    matmul shapes); ids beyond the tokenizer's vocabulary are simply never produced by data."""
    hidden_size: int = 768
    """Width of the residual stream."""
    num_hidden_layers: int = 12
    """Number of transformer blocks."""
    num_attention_heads: int = 12
    """Query heads."""
    head_dim: int | None = None
    """Width of one attention head. None: hidden_size / num_attention_heads (some HF models,
    e.g. Gemma-style Llamas, set it explicitly: then heads * head_dim may differ from
    hidden_size)."""
    num_key_value_heads: int | None = None
    """Key/value heads: = heads is MHA, 1 is MQA, in between is GQA (Ainslie et al. 2023).
    None means num_attention_heads."""
    intermediate_size: int | None = None
    """SwiGLU hidden width. None: 8/3 * hidden_size (keeps the FLOPs of a 4x GELU MLP, Shazeer
    2020 "GLU Variants Improve Transformer"), rounded up to `intermediate_multiple_of`."""
    intermediate_multiple_of: int = 256
    """Rounding of the derived intermediate_size (Meta's llama uses `multiple_of=256`)."""
    max_position_embeddings: int = 2048
    """Longest sequence the model is trained for (RoPE itself has no table, so this only
    bounds training lengths and is what FLOP estimates assume)."""
    rope_theta: float = 10000.0
    """RoPE base: frequencies are theta^(-2i/head_dim) (Su et al. 2021)."""
    rope_scaling: dict[str, Any] | None = None
    """Stretched RoPE frequencies for a longer context, as HF writes them (see model/rope.py):
    {"rope_type": "linear", "factor": f} or {"rope_type": "llama3", "factor",
    "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}. None: plain."""
    rms_norm_eps: float = 1e-5
    """Epsilon inside RMSNorm's square root."""
    tie_word_embeddings: bool = True
    """Share the input embedding and the output projection (one tensor, one gradient)."""
    dropout: float = 0.0
    """Dropout on attention probabilities and on each residual branch (training only)."""
    initializer_range: float = 0.02
    """Std of the normal init; residual output projections get std/sqrt(2*layers)."""
    vocab_size_multiple: int = 64
    """Padding multiple for vocab_size; `from_hf` uses 1 to keep an HF vocabulary exact."""
    tokenizer_fingerprint: str | None = None
    """Fingerprint of the tokenizer the model is trained with (set by the trainer), so a
    tool given another tokenizer refuses it (model/run_tokenizer.py). None: not recorded."""
    hf_config: dict[str, Any] | None = None
    """The HF `config.json` a model was loaded from (`from_hf`), kept whole so an export
    writes back every field, including those z2all does not use. None: made here."""
    activation_checkpointing: bool = False
    """Recompute block activations in backward instead of storing them (less memory, ~+33%
    compute)."""
    activation_checkpointing_every: int = 1
    """With activation_checkpointing: checkpoint every k-th block only (k=2 halves the extra
    compute and keeps half the activations)."""

    def __post_init__(self) -> None:
        check_field_values(self)
        self.vocab_size = round_up(self.vocab_size, self.vocab_size_multiple)
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.intermediate_size is None:
            self.intermediate_size = round_up(8 * self.hidden_size // 3,
                                              self.intermediate_multiple_of)
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple "
                             f"of num_key_value_heads {self.num_key_value_heads} (GQA groups)")
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")
        if self.activation_checkpointing_every < 1:
            raise ValueError("activation_checkpointing_every must be >= 1")

    def function_fields(self) -> dict[str, Any]:
        """The fields that decide what the model computes from its weights (`FUNCTION_FIELDS`),
        not bookkeeping such as the init or the recorded tokenizer: a LoRA checkpoint records
        them of its base (model/lora_checkpoint.py), as the weights alone would not notice a
        changed `rope_theta`."""
        return {name: getattr(self, name) for name in FUNCTION_FIELDS}

    # ---- presets ----------------------------------------------------------------------------
    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> Z2allConfig:
        """A named size (see the module docstring) with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    # ---- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"model_type": "z2all", **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "<dict>") -> Z2allConfig:
        """Strict: an unknown key is an error (a typo must not silently fall back to a default).
        `vocab_size` is already padded in a saved config, so re-padding is a no-op."""
        values = {k: v for k, v in values.items() if k != "model_type"}
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{source}: unknown Z2allConfig keys {unknown}")
        try:
            return cls(**values)
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None

    def to_json_file(self, path: str | os.PathLike) -> None:
        atomic_write_json(path, self.to_dict())

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> Z2allConfig:
        values = read_config_json(path)
        if not is_z2all_config(values):
            raise ValueError(f"{path}: model_type is {values['model_type']!r}, not 'z2all' "
                             "(for a Hugging Face Llama directory use Z2allForCausalLM.from_hf)")
        return cls.from_dict(values, source=str(path))


# Sizes are whole numbers >= 1 (a None field is derived in __post_init__) and at most
# MAX_SIZE: 16.7 M is far above any real model's width, vocabulary or context (Llama 3.1
# 405B: hidden 16384, vocabulary 128256, 131072 positions), so a larger value is a typo or a
# damaged file, refused before it becomes a tensor shape.
SIZE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "head_dim", "num_key_value_heads", "intermediate_size", "intermediate_multiple_of",
               "max_position_embeddings", "vocab_size_multiple",
               "activation_checkpointing_every")
MAX_SIZE = 2 ** 24
POSITIVE_FIELDS = ("rope_theta", "rms_norm_eps")  # finite numbers > 0
FLAG_FIELDS = ("tie_word_embeddings", "activation_checkpointing")


def check_field_values(config: Z2allConfig) -> None:
    """Refuse, in one line naming every bad field, a value of the wrong type or out of range
    (a `"hidden_size": 1e30` in a config.json would otherwise fail deep inside torch)."""
    problems = []
    for name in SIZE_FIELDS:
        value = getattr(config, name)
        if value is not None and not (type(value) is int and 1 <= value <= MAX_SIZE):
            problems.append(f"{name} must be a whole number in [1, {MAX_SIZE}], got {value!r}")
    for name in POSITIVE_FIELDS:
        value = getattr(config, name)
        if not (_is_number(value) and math.isfinite(value) and value > 0):
            problems.append(f"{name} must be a finite number > 0, got {value!r}")
    if not (_is_number(config.initializer_range) and 0 <= config.initializer_range < math.inf):
        problems.append(f"initializer_range must be a finite number >= 0, got "
                        f"{config.initializer_range!r}")
    if not (_is_number(config.dropout) and 0 <= config.dropout < 1):
        problems.append(f"dropout must be a number in [0, 1), got {config.dropout!r}")
    problems += [f"{name} must be true or false, got {getattr(config, name)!r}"
                 for name in FLAG_FIELDS if not isinstance(getattr(config, name), bool)]
    if problems:
        raise ValueError("; ".join(problems))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_config_json(path: str | os.PathLike) -> dict[str, Any]:
    """A model's `config.json` (ours or Hugging Face's) as a dict; a file that is not a JSON
    object is refused in one line naming it and the line."""
    try:
        with open(path, encoding="utf-8") as handle:
            values = json.load(handle)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: invalid JSON: {error.msg}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text, so not a config.json") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a JSON object of config fields")
    return values


def is_z2all_config(values: dict[str, Any]) -> bool:
    """A config.json's fields are ours (`"model_type": "z2all"`, or none in older saves), not
    a Hugging Face model's."""
    return values.get("model_type", "z2all") == "z2all"


FUNCTION_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                   "head_dim", "num_key_value_heads", "intermediate_size", "rope_theta",
                   "rope_scaling", "rms_norm_eps", "tie_word_embeddings", "dropout")

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=4096, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512),
    "0.1B": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=12, max_position_embeddings=1024),
    "0.5B": dict(hidden_size=1280, num_hidden_layers=24, num_attention_heads=20,
                 num_key_value_heads=4, max_position_embeddings=2048),
    "1.7B": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, intermediate_size=7168, max_position_embeddings=2048,
                 tie_word_embeddings=False),
}
