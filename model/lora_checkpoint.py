"""What a LoRA run saves: the adapters and a verified reference to the frozen base, not the base.

A LoRA checkpoint directory (written by the trainer into its usual temp dir, next to `optim/`
and `trainer_state.pt`, then sealed by `utils/checkpoint.py`'s manifest) holds:

    lora.json                   {"format": "z2all-lora", "version": 2,
                                 "lora": {"rank": 8, "alpha": 16.0, "dropout": 0.05,
                                          "targets": "q_proj,k_proj,v_proj,o_proj,..."},
                                 "base": {"path": "/abs/out/sft/ckpt/step_000400",
                                          "fingerprint": "3f0c9a1d2e4b5c6d",
                                          "config": {"rope_theta": 10000.0, ...},
                                          "tokenizer_fingerprint": "9b1e..."}}
    lora_adapters.safetensors   the adapters under our parameter names, in training dtype:
                                model.layers.0.self_attn.qkv_proj.lora_A.q_proj  [r, hidden]
                                model.layers.0.self_attn.qkv_proj.lora_B.q_proj  [H*D, r] ...

`base.path` is the absolute model directory the run started from (`--init_from` resolved to one
checkpoint, or an HF Llama dir), `base.fingerprint` is `weights_fingerprint` of that model as
loaded, before any dtype change, `base.config` its `Z2allConfig.function_fields()` (the same
weights with another `rope_theta` or `rms_norm_eps` are another model) and
`base.tokenizer_fingerprint` that of its own tokenizer (None: it has none). Reloading
(`model.loading.load_lora_checkpoint`) loads the base again, refuses it if any of these differs
(the base was retrained, replaced or edited), applies the adapters and copies the saved ones in:
bitwise the model that was saved, so a resume continues exactly. There is no
`config.json`/`model.safetensors` in it: the checkpoint is a few MB, not a copy of the model.
Version 1 records (before the config and tokenizer were recorded) still load, with their weights
verified and a warning.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save

from model.lora import LoraConfig, lora_state_dict
from utils.atomic_io import atomic_write_bytes, atomic_write_json

LORA_FILE = "lora.json"
ADAPTERS_FILE = "lora_adapters.safetensors"
LORA_FORMAT = "z2all-lora"
LORA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: the base's path and weights fingerprint only


def is_lora_checkpoint(directory: str | os.PathLike) -> bool:
    return (Path(directory) / LORA_FILE).is_file()


def save_lora_checkpoint(model: Any, config: LoraConfig, base: dict[str, Any],
                         directory: str | os.PathLike) -> None:
    """Write `lora.json` and `lora_adapters.safetensors` (each atomically) into `directory`.
    `base`: `model.loading.lora_base_reference` of the base model."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.contiguous() for name, tensor in lora_state_dict(model).items()}
    atomic_write_bytes(directory / ADAPTERS_FILE, save(tensors, metadata={"format": "pt"}))
    atomic_write_json(directory / LORA_FILE, {
        "format": LORA_FORMAT, "version": LORA_VERSION, "lora": config.to_dict(),
        "base": {**base, "path": str(base["path"])}})


def read_lora_checkpoint(directory: str | os.PathLike
                         ) -> tuple[LoraConfig, dict[str, Any], dict[str, Any]]:
    """(the LoRA config, the base reference, the saved adapters) of a LoRA checkpoint."""
    config, base = read_lora_record(directory)
    return config, base, load_file(Path(directory) / ADAPTERS_FILE)


def read_lora_record(directory: str | os.PathLike) -> tuple[LoraConfig, dict[str, Any]]:
    """(the LoRA config, the base reference) from a LoRA checkpoint's `lora.json`, without
    reading its adapters (enough to find, and plan, its base)."""
    record_file = Path(directory) / LORA_FILE
    record = json.loads(record_file.read_text(encoding="utf-8"))
    if record.get("format") != LORA_FORMAT or record.get("version") not in READABLE_VERSIONS:
        raise ValueError(f"{record_file}: not a {LORA_FORMAT} record of version "
                         f"{' or '.join(map(str, READABLE_VERSIONS))} "
                         f"(format {record.get('format')!r}, version {record.get('version')!r})")
    return LoraConfig(**record["lora"]), record["base"]
