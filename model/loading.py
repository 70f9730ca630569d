"""Where a model comes from: the one resolver behind every `--ckpt` and `--init_from`.

    what the path is                                   what is loaded
    an HF dir (config.json: model_type not "z2all")    Z2allForCausalLM.from_hf(path) (refuses
                                                       what is not a representable Llama)
    one checkpoint dir (has manifest.json / step_N)    that checkpoint, after its manifest verifies
    a run dir or its ckpt/ dir                         the newest checkpoint whose manifest verifies
    a bare `save_pretrained` dir (no manifest)         as it is: nothing to verify it against
    a LoRA checkpoint (lora.json, any of the above)    its base (verified: weights, config,
                                                       tokenizer; model/lora_checkpoint.py) with
                                                       the adapters merged in (for inference;
                                                       `load_lora_checkpoint` keeps them apart)
                                                       (never a run's ckpt/step_N or ckpt/best:
                                                       those had a manifest, so one is needed)

`generate.py`, `model.convert_to_hf`, the trainer's `--init_from` and the DPO reference, and
`tools.demo_eval` all call `load_model`, so a damaged checkpoint is refused the same way
everywhere (never loaded because the caller named its folder directly).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from model.configuration_z2all import Z2allConfig, is_z2all_config, read_config_json
from model.hf_llama_mapping import config_from_hf
from model.lora import (
    LoraConfig,
    apply_lora,
    load_lora_state_dict,
    merge_and_unload,
    weights_fingerprint,
)
from model.lora_checkpoint import (
    LORA_FILE,
    is_lora_checkpoint,
    read_lora_checkpoint,
    read_lora_record,
)
from model.modeling_z2all import CONFIG_FILE, WEIGHTS_FILE, Z2allForCausalLM, hf_weight_files
from model.run_tokenizer import default_tokenizer_dir, model_tokenizer
from tokenizer import PretrainedTokenizer, load_tokenizer
from tokenizer.z2all_tokenizer import Z2allTokenizer
from utils.checkpoint import MANIFEST, CheckpointError, is_step_dir, resolve_checkpoint
from utils.hub import local_dir
from utils.precision import DTYPES, resolve_dtype


def is_hf_model_dir(path: Path) -> bool:
    """A Hugging Face model directory: a config.json that is not ours (`from_hf` then accepts
    a Llama or says in one line why not)."""
    config_file = path / CONFIG_FILE
    return config_file.is_file() and not is_z2all_config(read_config_json(config_file))


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """The directory whose weights `load_model(path)` reads (see the module docstring): an HF
    dir or a bare save as it is, anything else through its verified checkpoints."""
    path = Path(path)
    if is_hf_model_dir(path):
        return path
    has_weights = (((path / WEIGHTS_FILE).is_file() and (path / CONFIG_FILE).is_file())
                   or (path / LORA_FILE).is_file())
    if has_weights and not (path / MANIFEST).exists() and not is_step_dir(path):
        return path  # a bare save: nothing to verify it against
    return resolve_checkpoint(path)  # verifies; raises CheckpointError with the reason


def load_model(path: str | os.PathLike) -> tuple[Z2allForCausalLM, Path]:
    """(the model, the directory its weights came from) for any kind of path above."""
    model_dir = resolve_model_dir(path)
    return load_model_at(model_dir), model_dir


def load_model_at(model_dir: Path) -> Z2allForCausalLM:
    """The model whose weights are in `model_dir`, as `resolve_model_dir` names it (a caller
    that resolved the path once, and checked it, loads without verifying it again)."""
    if is_lora_checkpoint(model_dir):
        model, _, _ = load_lora_checkpoint(model_dir)
        return merge_and_unload(model)
    check_weight_files(model_files_at(model_dir).weight_files())
    if is_hf_model_dir(model_dir):
        return Z2allForCausalLM.from_hf(model_dir)
    return Z2allForCausalLM.from_pretrained(model_dir)


@dataclass(frozen=True)
class ModelFiles:
    """What a model directory (as `resolve_model_dir` names it) holds, read without its weights;
    a LoRA checkpoint's are its base's (the base resolved like any path)."""

    directory: Path  # where the weights are: the LoRA base's directory for a LoRA checkpoint
    config: Z2allConfig
    is_hf: bool      # an HF model dir: its weight files are the ones transformers reads

    def weight_files(self) -> list[Path]:
        """The safetensors files the weights are read from."""
        names = hf_weight_files(self.directory) if self.is_hf else [WEIGHTS_FILE]
        return [self.directory / name for name in names]


def model_files_at(model_dir: Path) -> ModelFiles:
    """The config (and where the weights are) of the model whose weights are in `model_dir`."""
    if is_lora_checkpoint(model_dir):
        _, base = read_lora_record(model_dir)
        return model_files_at(resolve_model_dir(base["path"]))
    config_file = model_dir / CONFIG_FILE
    values = read_config_json(config_file)  # read once: it says which kind, and the shapes
    if is_z2all_config(values):
        return ModelFiles(model_dir, Z2allConfig.from_dict(values, source=str(config_file)),
                          is_hf=False)
    return ModelFiles(model_dir, config_from_hf(values, source=str(config_file)), is_hf=True)


def model_config_at(model_dir: Path) -> Z2allConfig:
    """The config of the model whose weights are in `model_dir`, without reading the weights."""
    return model_files_at(model_dir).config


def check_weight_files(weight_files: list[Path]) -> None:
    """Refuse, in one line naming the file, weights that safetensors cannot open: a truncated
    download or copy, whose header promises more bytes than the file holds. Only the headers
    are read, so callers may check before any work (the trainer does, once, on rank 0). A
    LoRA checkpoint's are its base's (`model_files_at`; its adapters are read whole, and
    checked, on loading)."""
    for path in weight_files:
        try:
            with safe_open(path, framework="pt"):
                pass
        except SafetensorError as error:
            raise ValueError(f"{path}: not a complete safetensors file ({error}); "
                             "it may be truncated: download or copy it again") from None


def lora_base_reference(model: Z2allForCausalLM, model_dir: Path) -> dict[str, Any]:
    """What a LoRA checkpoint records about its base (`model/lora_checkpoint.py`): its path,
    weights fingerprint, the config fields that decide its function and its own tokenizer's
    fingerprint (None if it has none). Call it on `load_model(--init_from)`'s result before any
    dtype change or `apply_lora`."""
    own_tokenizer = default_tokenizer_dir(model_dir, model_dir)
    return {"path": str(Path(model_dir).resolve()), "fingerprint": weights_fingerprint(model),
            "config": model.config.function_fields(),
            "tokenizer_fingerprint": (None if own_tokenizer is None
                                      else load_tokenizer(own_tokenizer).fingerprint)}


def base_changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """How a LoRA base differs from its record, as "what: now X, recorded Y"; what an older
    record lacks is not compared."""
    compared = [("weights fingerprint", current["fingerprint"], recorded["fingerprint"])]
    if "tokenizer_fingerprint" in recorded:
        compared.append(("tokenizer fingerprint", current["tokenizer_fingerprint"],
                         recorded["tokenizer_fingerprint"]))
    recorded_config = recorded.get("config", {})
    compared += [(name, value, recorded_config[name])
                 for name, value in current["config"].items() if name in recorded_config]
    return [f"{what}: now {now!r}, recorded {then!r}" for what, now, then in compared
            if now != then]


def load_model_config(path: str | os.PathLike) -> Z2allConfig:
    """The config of the model `load_model(path)` would build, read without its weights (a
    planner needs only the shapes). A LoRA checkpoint is refused: plan its base instead."""
    model_dir = resolve_model_dir(path)
    if is_lora_checkpoint(model_dir):
        raise ValueError(f"{path}: a LoRA checkpoint; give its base model and --lora_rank")
    return model_config_at(model_dir)


def load_lora_checkpoint(model_dir: str | os.PathLike
                         ) -> tuple[Z2allForCausalLM, LoraConfig, dict[str, Any]]:
    """(the base with live adapters holding the saved values, their config, the base
    reference as it is now) of a LoRA checkpoint: to resume training, or to export a peft
    adapter. A base that changed since is refused in one line naming what changed."""
    config, recorded, adapters = read_lora_checkpoint(model_dir)
    record_file = Path(model_dir) / LORA_FILE
    model, base_dir = load_model(recorded["path"])
    current = lora_base_reference(model, base_dir)
    changes = base_changes(recorded, current)
    if changes:
        raise CheckpointError(f"{record_file}: its base {recorded['path']} has changed since "
                              f"the LoRA run ({'; '.join(changes)}); restore that base or "
                              "retrain the adapters")
    if "config" not in recorded:
        warnings.warn(f"{record_file} records only its base's weights (an older z2all): the "
                      "base's config and tokenizer are not verified; a resumed run records "
                      "them from now on", stacklevel=2)
    apply_lora(model, config)
    load_lora_state_dict(model, adapters, source=str(model_dir))
    return model, config, current


# ------------------------------------------------------------------ model runners' shared CLI

def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """`--ckpt`, `--tokenizer_dir`, `--device`, `--dtype`: how every model runner (generate.py,
    serve.py) is told which model to run and how."""
    parser.add_argument("--ckpt", required=True,
                        help="run dir, checkpoint dir, save_pretrained dir, HF Llama dir or "
                             "its Hub id org/name (utils/hub.py)")
    parser.add_argument("--tokenizer_dir", default=None,
                        help="default: the model's own (model/run_tokenizer.py); another one "
                             "is refused")
    parser.add_argument("--revision", default=None,
                        help="Hub branch, tag or commit of a Hub id --ckpt / --tokenizer_dir")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                        help="auto: as the trainer decides (utils/precision.py: measured on "
                             "CPU, bf16 on CUDA where supported)")


def resolve_model_arguments(args: argparse.Namespace) -> None:
    """`--ckpt` / `--tokenizer_dir` given as Hub ids become their snapshot dirs in the HF
    cache (a local directory of the same spelling wins)."""
    args.ckpt = local_dir(args.ckpt, "--ckpt", args.revision)
    if args.tokenizer_dir:
        args.tokenizer_dir = local_dir(args.tokenizer_dir, "--tokenizer_dir", args.revision)


def load_for_inference(args: argparse.Namespace
                       ) -> tuple[Z2allForCausalLM, Z2allTokenizer | PretrainedTokenizer]:
    """The model (on `--device`, in the precision `--dtype` resolves to, in eval mode) and its
    tokenizer. The precision choice is printed to stderr: stdout may be the generated text."""
    model, model_dir = load_model(args.ckpt)
    tokenizer = model_tokenizer(args.ckpt, model.config, model_dir, args.tokenizer_dir)
    device = torch.device(args.device)
    precision = resolve_dtype(args.dtype, device)
    print(precision.reason, file=sys.stderr)
    return model.to(device=device, dtype=DTYPES[precision.dtype]).eval(), tokenizer


def check_device(device: str) -> None:
    """Refuse a `--device` this machine does not have, in one line, before loading anything."""
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device}: not a device name (use cpu, cuda or cuda:N)"
                         ) from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available on this machine; "
                         "use --device cpu")
    if parsed.type == "cuda" and (parsed.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} "
                         "CUDA device(s)")
