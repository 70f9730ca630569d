"""Where a model comes from: the one resolver behind every `--ckpt` and `--init_from`.

    what the path is                                   what is loaded
    an HF Llama dir (config.json: model_type "llama")  Z2allForCausalLM.from_hf(path)
    one checkpoint dir (has manifest.json / step_N)    that checkpoint, after its manifest verifies
    a run dir or its ckpt/ dir                         the newest checkpoint whose manifest verifies
    a bare `save_pretrained` dir (no manifest)         as it is: nothing to verify it against
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

from model.modeling_z2all import CONFIG_FILE, WEIGHTS_FILE, Z2allForCausalLM
from tokenizer import load_tokenizer
from tokenizer.z2all_tokenizer import Z2allTokenizer
from utils.checkpoint import MANIFEST, is_step_dir, resolve_checkpoint
from utils.precision import DTYPES, resolve_dtype


def is_hf_llama_dir(path: Path) -> bool:
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        return False
    with open(config_file, encoding="utf-8") as handle:
        return json.load(handle).get("model_type") == "llama"


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """The directory whose weights `load_model(path)` reads (see the module docstring)."""
    path = Path(path)
    is_bare_save = ((path / WEIGHTS_FILE).is_file() and (path / CONFIG_FILE).is_file()
                    and not (path / MANIFEST).exists() and not is_step_dir(path))
    if is_hf_llama_dir(path) or is_bare_save:
        return path
    return resolve_checkpoint(path)  # verifies; raises CheckpointError with the reason


def load_model(path: str | os.PathLike) -> tuple[Z2allForCausalLM, Path]:
    """(the model, the directory its weights came from) for any kind of path above."""
    model_dir = resolve_model_dir(path)
    if is_hf_llama_dir(model_dir):
        return Z2allForCausalLM.from_hf(model_dir), model_dir
    return Z2allForCausalLM.from_pretrained(model_dir), model_dir


def default_tokenizer_dir(ckpt: Path, model_dir: Path) -> Path:
    """The run's tokenizer: `tokenizer_dir` in out/<run>/config.json (given the run dir or one
    of its checkpoints), or a tokenizer stored next to the weights (an exported HF dir)."""
    for run_config in (ckpt / "config.json", model_dir.parent.parent / "config.json"):
        if run_config.is_file():
            tokenizer_dir = json.loads(run_config.read_text()).get("tokenizer_dir")
            if tokenizer_dir:
                return Path(tokenizer_dir)
    if (model_dir / "tokenizer_config.json").is_file():
        return model_dir
    raise ValueError(f"no tokenizer recorded for {ckpt}; pass --tokenizer_dir")


# ------------------------------------------------------------------ model runners' shared CLI

def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """`--ckpt`, `--tokenizer_dir`, `--device`, `--dtype`: how every model runner (generate.py,
    serve.py) is told which model to run and how."""
    parser.add_argument("--ckpt", required=True,
                        help="run dir, checkpoint dir, save_pretrained dir or HF Llama dir")
    parser.add_argument("--tokenizer_dir", default=None,
                        help="default: tokenizer_dir from the run's config.json")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                        help="auto: as the trainer decides (utils/precision.py: measured on "
                             "CPU, bf16 on CUDA where supported)")


def load_for_inference(args: argparse.Namespace) -> tuple[Z2allForCausalLM, Z2allTokenizer]:
    """The model (on `--device`, in the precision `--dtype` resolves to, in eval mode) and its
    tokenizer. The precision choice is printed to stderr: stdout may be the generated text."""
    model, model_dir = load_model(args.ckpt)
    tokenizer = load_tokenizer(args.tokenizer_dir
                               or default_tokenizer_dir(Path(args.ckpt), model_dir))
    device = torch.device(args.device)
    precision = resolve_dtype(args.dtype, device)
    print(precision.reason, file=sys.stderr)
    return model.to(device=device, dtype=DTYPES[precision.dtype]).eval(), tokenizer
