"""Our config and weights <-> Hugging Face `LlamaForCausalLM`'s, both ways.

The architectures are the same (RMSNorm, RoPE with the rotate_half pairing, GQA, SwiGLU), and
our parameter names are HF's, except two fused matrices:

    ours                                   HF Llama
    model.layers.N.self_attn.qkv_proj      q_proj (H*D rows), k_proj (KV*D), v_proj (KV*D)
    model.layers.N.mlp.gate_up_proj        gate_proj (I rows), up_proj (I rows)
    lm_head.weight (tied: the embedding)   omitted when tie_word_embeddings

Because our RoPE pairs dimension i with i + head_dim/2 exactly like HF's `rotate_half`, no
q/k row permutation is needed (Meta's original checkpoints pair 2i with 2i+1 and need one).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from model.configuration_z2all import Z2allConfig

_QKV = re.compile(r"(.*\.self_attn\.)qkv_proj\.weight")
_GATE_UP = re.compile(r"(.*\.mlp\.)gate_up_proj\.weight")
_Q = re.compile(r"(.*\.self_attn\.)q_proj\.weight")
_GATE = re.compile(r"(.*\.mlp\.)gate_proj\.weight")


def config_to_hf(config: Z2allConfig, dtype: torch.dtype,
                 eos_token_id: int | None = None) -> dict[str, Any]:
    """A `config.json` for `LlamaForCausalLM`.

    A model that came from HF gets its own config.json back, field for field (only the dtype
    is updated): fine-tuning changes no shape, and fields z2all does not read (bos/eos ids,
    generation hints) must survive. A model made here: transformers 4.x reads rope_theta and
    rope_scaling, 5.x rope_parameters; both are written. Our tokenizers have no BOS; EOS
    doubles as padding (unknown to the model itself: pass it from the tokenizer, else HF's
    default ids 1/2 would silently stop `generate` at an ordinary token)."""
    dtype_name = str(dtype).removeprefix("torch.")
    if config.hf_config is not None:
        written = dict(config.hf_config)
        dtype_keys = [key for key in ("dtype", "torch_dtype") if key in written] or ["dtype"]
        return {**written, **{key: dtype_name for key in dtype_keys}}
    rope = {"rope_type": "default", "rope_theta": config.rope_theta, **(config.rope_scaling or {})}
    return {
        "bos_token_id": None, "eos_token_id": eos_token_id, "pad_token_id": eos_token_id,
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
        "hidden_act": "silu", "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling, "rope_parameters": rope,
        "tie_word_embeddings": config.tie_word_embeddings,
        "initializer_range": config.initializer_range, "attention_bias": False,
        "mlp_bias": False, "attention_dropout": config.dropout, "dtype": dtype_name,
    }


# Fields of an HF Llama config that z2all's model cannot honour: (field, unsupported when).
_UNSUPPORTED = (
    ("attention_bias", lambda value: bool(value), "no bias in q/k/v/o projections"),
    ("mlp_bias", lambda value: bool(value), "no bias in the MLP"),
    ("sliding_window", lambda value: value is not None, "attention is full, not windowed"),
    ("hidden_act", lambda value: value != "silu", "the MLP is SwiGLU (silu)"),
    ("pretraining_tp", lambda value: value not in (None, 1), "no tensor-parallel slicing"),
)
_SCALING_KEYS = {"linear": ("factor",),
                 "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                            "original_max_position_embeddings")}


def _rope_from_hf(hf: dict[str, Any]) -> tuple[float, dict[str, Any] | None, str | None]:
    """(rope_theta, our rope_scaling or None, a problem or None). transformers 5.x writes
    `rope_parameters` (theta inside), 4.x `rope_scaling` + a top-level `rope_theta`."""
    field = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    rope = dict(hf.get(field) or {})
    theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    if rope_type == "default":
        return theta, None, None
    if rope_type not in _SCALING_KEYS:
        return theta, None, (f"{field}.rope_type={rope_type!r} (z2all supports default, "
                             f"{', '.join(_SCALING_KEYS)})")
    missing = [key for key in _SCALING_KEYS[rope_type] if key not in rope]
    if missing:
        return theta, None, f"{field} of type {rope_type!r} lacks {missing}"
    return theta, {"rope_type": rope_type,
                   **{key: rope[key] for key in _SCALING_KEYS[rope_type]}}, None


REQUIRED_HF_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "intermediate_size")


def config_from_hf(hf: dict[str, Any], source: str) -> Z2allConfig:
    """A `Z2allConfig` for an HF Llama config dict; refuses, in one line naming each field,
    what our model cannot represent."""
    if hf.get("model_type") != "llama":
        raise ValueError(f"{source}: model_type={hf.get('model_type')!r}: z2all loads "
                         "LlamaForCausalLM directories (model_type 'llama') only")
    problems = [f"{field}={hf[field]!r} ({why})" for field, unsupported, why in _UNSUPPORTED
                if field in hf and unsupported(hf[field])]
    rope_theta, rope_scaling, rope_problem = _rope_from_hf(hf)
    problems += [rope_problem] if rope_problem else []
    if problems:
        raise ValueError(f"{source}: unsupported Llama variant: {'; '.join(problems)}")
    missing = [field for field in REQUIRED_HF_FIELDS if field not in hf]
    if missing:
        raise ValueError(f"{source}: lacks {', '.join(missing)}, which a Llama config has")
    try:  # a value of the wrong type or out of range is refused by Z2allConfig
        return Z2allConfig(
            vocab_size=hf["vocab_size"], vocab_size_multiple=1, hidden_size=hf["hidden_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"],
            num_key_value_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            head_dim=hf.get("head_dim"), intermediate_size=hf["intermediate_size"],
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rope_theta=rope_theta, rope_scaling=rope_scaling,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            dropout=hf.get("attention_dropout", 0.0) or 0.0,
            initializer_range=hf.get("initializer_range", 0.02), hf_config=hf)
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from None


def hf_projection_rows(config: Z2allConfig) -> dict[str, list[tuple[str, int]]]:
    """Each of our linear layers in a block -> the HF projections stacked in its rows, in
    order, with their row counts (LoRA targets and the q/k/v split both use this)."""
    query_rows = config.num_attention_heads * config.head_dim
    kv_rows = config.num_key_value_heads * config.head_dim
    return {"qkv_proj": [("q_proj", query_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)],
            "o_proj": [("o_proj", config.hidden_size)],
            "gate_up_proj": [("gate_proj", config.intermediate_size),
                             ("up_proj", config.intermediate_size)],
            "down_proj": [("down_proj", config.hidden_size)]}


def state_dict_to_hf(state_dict: dict[str, torch.Tensor], config: Z2allConfig
                     ) -> dict[str, torch.Tensor]:
    """Our tensors under HF names; split matrices are copies (safetensors refuses views)."""
    qkv_rows = [rows for _, rows in hf_projection_rows(config)["qkv_proj"]]
    hf_state = {}
    for name, tensor in state_dict.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if match := _QKV.fullmatch(name):
            for part, piece in zip(("q", "k", "v"), tensor.split(qkv_rows)):
                hf_state[f"{match[1]}{part}_proj.weight"] = piece.clone()
        elif match := _GATE_UP.fullmatch(name):
            gate, up = tensor.chunk(2)
            hf_state[f"{match[1]}gate_proj.weight"] = gate.clone()
            hf_state[f"{match[1]}up_proj.weight"] = up.clone()
        else:
            hf_state[name] = tensor.contiguous()
    return hf_state


def state_dict_from_hf(hf_state: dict[str, torch.Tensor], config: Z2allConfig
                       ) -> dict[str, torch.Tensor]:
    """HF tensors under our names (lm_head dropped when tied: the model shares the embedding).
    Missing or extra names are left for `load_state_dict(strict=True)` to report."""
    consumed = set()
    state = {}
    for name in hf_state:
        if match := _Q.fullmatch(name):
            parts = [f"{match[1]}{part}_proj.weight" for part in ("q", "k", "v")]
            state[f"{match[1]}qkv_proj.weight"] = torch.cat([hf_state[p] for p in parts])
            consumed.update(parts)
        elif match := _GATE.fullmatch(name):
            parts = [f"{match[1]}{part}_proj.weight" for part in ("gate", "up")]
            state[f"{match[1]}gate_up_proj.weight"] = torch.cat([hf_state[p] for p in parts])
            consumed.update(parts)
    for name, tensor in hf_state.items():
        tied_head = name == "lm_head.weight" and config.tie_word_embeddings
        if name in consumed or tied_head or name.endswith("rotary_emb.inv_freq"):
            continue  # (old HF checkpoints saved RoPE's inv_freq; we recompute it)
        state[name] = tensor
    return state
