"""Where a model comes from: the one resolver behind every `--ckpt` and `--init_from`.

    what the path is                                   what is loaded
    an HF dir (config.json: model_type not "z2all")    Z2allForCausalLM.from_hf(path) (refuses
                                                       what is not a representable Llama)
    one checkpoint dir (has manifest.json / step_N)    that checkpoint, after its manifest verifies
    a run dir or its ckpt/ dir                         the newest checkpoint whose manifest verifies
    a bare `save_pretrained` dir (no manifest)         as it is: nothing to verify it against
    a LoRA checkpoint (lora.json, any of the above)    its base (verified by fingerprint) with
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
import json
import os
import sys
from pathlib import Path

import torch

from model.lora import (
    LoraConfig,
    apply_lora,
    load_lora_state_dict,
    merge_and_unload,
    weights_fingerprint,
)
from model.lora_checkpoint import LORA_FILE, is_lora_checkpoint, read_lora_checkpoint
from model.modeling_z2all import CONFIG_FILE, WEIGHTS_FILE, Z2allForCausalLM
from model.run_tokenizer import model_tokenizer
from tokenizer import PretrainedTokenizer
from tokenizer.z2all_tokenizer import Z2allTokenizer
from utils.checkpoint import MANIFEST, CheckpointError, is_step_dir, resolve_checkpoint
from utils.precision import DTYPES, resolve_dtype


def is_hf_model_dir(path: Path) -> bool:
    """A Hugging Face model directory: a config.json that is not ours (`from_hf` then accepts
    a Llama or says in one line why not)."""
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        return False
    with open(config_file, encoding="utf-8") as handle:
        return json.load(handle).get("model_type", "z2all") != "z2all"


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """The directory whose weights `load_model(path)` reads (see the module docstring)."""
    path = Path(path)
    has_weights = (((path / WEIGHTS_FILE).is_file() and (path / CONFIG_FILE).is_file())
                   or (path / LORA_FILE).is_file())
    is_bare_save = has_weights and not (path / MANIFEST).exists() and not is_step_dir(path)
    if is_hf_model_dir(path) or is_bare_save:
        return path
    return resolve_checkpoint(path)  # verifies; raises CheckpointError with the reason


def load_model(path: str | os.PathLike) -> tuple[Z2allForCausalLM, Path]:
    """(the model, the directory its weights came from) for any kind of path above."""
    model_dir = resolve_model_dir(path)
    if is_lora_checkpoint(model_dir):
        model, _, _ = load_lora_checkpoint(model_dir)
        return merge_and_unload(model), model_dir
    if is_hf_model_dir(model_dir):
        return Z2allForCausalLM.from_hf(model_dir), model_dir
    return Z2allForCausalLM.from_pretrained(model_dir), model_dir


def lora_base_reference(model: Z2allForCausalLM, model_dir: Path) -> dict[str, str]:
    """What a LoRA checkpoint records about its base (`model/lora_checkpoint.py`): call it on
    `load_model(--init_from)`'s result before any dtype change or `apply_lora`."""
    return {"path": str(Path(model_dir).resolve()), "fingerprint": weights_fingerprint(model)}


def load_lora_checkpoint(model_dir: str | os.PathLike
                         ) -> tuple[Z2allForCausalLM, LoraConfig, dict[str, str]]:
    """(the base with live adapters holding the saved values, their config, the base
    reference) of a LoRA checkpoint: to resume training, or to export a peft adapter."""
    config, base, adapters = read_lora_checkpoint(model_dir)
    model, _ = load_model(base["path"])
    if weights_fingerprint(model) != base["fingerprint"]:
        raise CheckpointError(
            f"{Path(model_dir) / LORA_FILE}: its base {base['path']} has changed since the "
            f"LoRA run (fingerprint {weights_fingerprint(model)}, recorded "
            f"{base['fingerprint']}); restore that base or retrain the adapters")
    apply_lora(model, config)
    load_lora_state_dict(model, adapters, source=str(model_dir))
    return model, config, base


# ------------------------------------------------------------------ model runners' shared CLI

def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """`--ckpt`, `--tokenizer_dir`, `--device`, `--dtype`: how every model runner (generate.py,
    serve.py) is told which model to run and how."""
    parser.add_argument("--ckpt", required=True,
                        help="run dir, checkpoint dir, save_pretrained dir or HF Llama dir")
    parser.add_argument("--tokenizer_dir", default=None,
                        help="default: the model's own (model/run_tokenizer.py); another one "
                             "is refused")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                        help="auto: as the trainer decides (utils/precision.py: measured on "
                             "CPU, bf16 on CUDA where supported)")


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
