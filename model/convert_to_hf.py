"""Export a z2all model as a Hugging Face `LlamaForCausalLM` directory.

    python -m model.convert_to_hf --ckpt out/<run> --out hf_model/   [--tokenizer_dir DIR]
    python -m model.convert_to_hf --ckpt out/<lora run> --out adapter/ --adapter

`--ckpt` takes a run dir (its newest valid checkpoint), one checkpoint dir, any
`save_pretrained` dir or an HF Llama dir. `--out` must be a new or empty directory outside the
source (and outside a LoRA run's base): nothing is ever overwritten. The result is a standard HF
Llama directory that loads offline, with no remote code: `config.json` + `model.safetensors`
(weights keep their dtype) for `LlamaForCausalLM.from_pretrained("hf_model/")`, and the model's
own tokenizer (found as model/run_tokenizer.py says; an explicit --tokenizer_dir must match it)
for `AutoTokenizer`. A model fine-tuned from an HF directory gets that directory's config.json
back unchanged and its tokenizer files as they were (template, generation_config.json). A z2all
tokenizer is written as `tokenizer.json` + `tokenizer_config.json` with the ChatML
chat_template, and a `generation_config.json` (stop at <|endoftext|> or <|im_end|>, pad with
<|endoftext|>, as generate.py does). No BOS on either side: HF's greedy output equals
generate.py's. The mapping (and why no RoPE permutation is needed) is in
`model/hf_llama_mapping.py`; the reverse direction is `Z2allForCausalLM.from_hf(dir)`.

A LoRA run (`model/lora_checkpoint.py`) exports by default as the merged model, the same
stock `LlamaForCausalLM` directory. With `--adapter` it becomes a peft adapter directory
instead: `adapter_config.json` + `adapter_model.safetensors`, for
`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), "adapter/")`, whose
`base_model_name_or_path` is the run's base when that is an HF Llama dir (a base from the HF
cache, `--init_from org/name`, is named by its Hub id, with the snapshot as `revision`, so
`AutoPeftModelForCausalLM` finds it on any machine), else the base exported beside it into
`adapter/base_model/`: an absolute path, or with `--base_path_relative` one relative to the
adapter directory (then adapter and base move together; join it to the adapter directory
before loading: `AutoPeftModelForCausalLM` reads it from the working one).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from safetensors.torch import save

from model.hf_llama_mapping import config_to_hf, state_dict_to_hf
from model.loading import (
    is_hf_model_dir,
    load_lora_checkpoint,
    load_model,
    resolve_model_arguments,
    resolve_model_dir,
)
from model.lora import LoraConfig, lora_state_dict
from model.lora_checkpoint import LORA_FILE, is_lora_checkpoint, read_lora_record
from model.modeling_z2all import CONFIG_FILE, WEIGHTS_FILE, Z2allForCausalLM
from model.run_tokenizer import default_tokenizer_dir, model_tokenizer
from tokenizer import PretrainedTokenizer
from tokenizer.z2all_tokenizer import Z2allTokenizer
from utils.atomic_io import atomic_write_bytes, atomic_write_json
from utils.boolean_flags import add_boolean_flag
from utils.checkpoint import is_step_dir
from utils.cli_errors import run_main
from utils.conversation import IM_END
from utils.hub import snapshot_of
from utils.log_setup import configure_logging
from utils.option_parser import OptionParser
from utils.run_ownership import overlap_problem

GENERATION_CONFIG_FILE = "generation_config.json"
PEFT_CONFIG_FILE = "adapter_config.json"
PEFT_WEIGHTS_FILE = "adapter_model.safetensors"
BASE_SUBDIR = "base_model"
# ours: model.layers.0.self_attn.qkv_proj.lora_A.q_proj   -> peft (adapter name dropped, as
# peft saves): base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
_OUR_ADAPTER = re.compile(r"(.*)\.\w+\.(lora_[AB])\.(\w+)")


def export_hf(model: Z2allForCausalLM, out_dir: str | os.PathLike,
              eos_token_id: int | None = None) -> None:
    """Write `config.json` + `model.safetensors` for `LlamaForCausalLM` (each atomically);
    `eos_token_id` (the tokenizer's `<|endoftext|>`) is recorded as EOS and pad."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    hf_state = state_dict_to_hf(state, model.config)
    atomic_write_bytes(out_dir / WEIGHTS_FILE, save(hf_state, metadata={"format": "pt"}))
    dtype = model.model.embed_tokens.weight.dtype
    atomic_write_json(out_dir / CONFIG_FILE, config_to_hf(model.config, dtype, eos_token_id))


def export_tokenizer(tokenizer: Z2allTokenizer | PretrainedTokenizer,
                     out_dir: str | os.PathLike) -> None:
    """The tokenizer's standard files, and the generation_config.json that goes with them (a
    pretrained tokenizer writes its own)."""
    tokenizer.save_pretrained(out_dir)
    if isinstance(tokenizer, PretrainedTokenizer):
        return
    atomic_write_json(Path(out_dir) / GENERATION_CONFIG_FILE, {
        "eos_token_id": [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)],
        "pad_token_id": tokenizer.pad_token_id, "bos_token_id": None})


def export_peft_adapter(model: Z2allForCausalLM, config: LoraConfig, base_dir: str,
                        out_dir: str | os.PathLike, revision: str | None = None) -> None:
    """Write the adapters of `model` (live, unmerged) as a peft LoRA adapter directory;
    `base_dir` a path or Hub id, `revision` the id's commit."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    peft_state = {}
    for name, tensor in lora_state_dict(model).items():
        parent, kind, hf_projection = _OUR_ADAPTER.fullmatch(name).groups()
        peft_state[f"base_model.model.{parent}.{hf_projection}.{kind}.weight"] = \
            tensor.contiguous()
    atomic_write_bytes(out_dir / PEFT_WEIGHTS_FILE, save(peft_state, metadata={"format": "pt"}))
    atomic_write_json(out_dir / PEFT_CONFIG_FILE, {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_dir,
        "revision": revision,
        "r": config.rank, "lora_alpha": config.alpha, "lora_dropout": config.dropout,
        "target_modules": config.target_names, "bias": "none", "fan_in_fan_out": False,
        "use_rslora": False, "use_dora": False, "inference_mode": True})


def export_lora_run_as_adapter(model_dir: Path, out_dir: str | os.PathLike,
                               eos_token_id: int | None, base_path_relative: bool = False) -> str:
    """The peft adapter directory of a LoRA checkpoint; returns the base it names: its Hub id
    when it is a snapshot in the HF cache, else a path, absolute or relative to the adapter
    directory (so both can move together)."""
    model, config, base = load_lora_checkpoint(model_dir)
    base_dir = Path(base["path"])
    if (hub := snapshot_of(base_dir)) is not None and is_hf_model_dir(base_dir):
        export_peft_adapter(model, config, hub["id"], out_dir, revision=hub["snapshot"])
        return hub["id"]
    if not is_hf_model_dir(base_dir):  # a z2all base: peft needs it as an HF model too
        base_model, _ = load_model(base_dir)
        base_dir = Path(out_dir).resolve() / BASE_SUBDIR
        export_hf(base_model, base_dir, eos_token_id)
    named = (os.path.relpath(base_dir, Path(out_dir).resolve()) if base_path_relative
             else str(base_dir))
    export_peft_adapter(model, config, named, out_dir)
    return named


def _model_places(path: str | os.PathLike) -> list[Path]:
    """A model directory and, for a run's checkpoint, the run that holds it."""
    path = Path(path).resolve()
    return [path, path.parent.parent] if is_step_dir(path) else [path]


def check_out_dir(out: str | os.PathLike, ckpt: str, model_dir: Path,
                  tokenizer_dir: str | os.PathLike | None) -> None:
    """Refuse (ValueError, one line) an `--out` that an export would damage: what it reads (the
    source run, its checkpoint, a LoRA run's base, the tokenizer), inside it or above it
    (utils/run_ownership.overlap_problem), or any directory that is not empty: an export
    replaces what it finds, and an earlier export cannot be told apart from a downloaded
    model, so nothing is overwritten (export again into a new directory)."""
    flag = f"--out {out}"
    reads = [("the source", place) for place in [*_model_places(ckpt), *_model_places(model_dir)]]
    if is_lora_checkpoint(model_dir):
        base = read_lora_record(model_dir)[1]["path"]
        reads += [("the LoRA base", place) for place in _model_places(base)]
    reads.append(("the tokenizer", tokenizer_dir or default_tokenizer_dir(ckpt, model_dir)))
    problem = overlap_problem(flag, out, reads, "export into a new or empty directory outside "
                                                "what the export reads")
    if problem:
        raise ValueError(problem)
    out = Path(out)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise ValueError(f"{flag}: exists and is not an empty directory, and an export "
                         "replaces what it finds; export into a new or empty directory")


def main(argv: list[str] | None = None) -> None:
    parser = OptionParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True,
                        help="run dir, checkpoint dir, save_pretrained dir, HF Llama dir or "
                             "its Hub id org/name")
    parser.add_argument("--revision", default=None, help="Hub revision of a Hub id --ckpt")
    parser.add_argument("--out", required=True, help="output directory for the HF model")
    parser.add_argument("--tokenizer_dir", default=None,
                        help="default: the model's own (model/run_tokenizer.py); another one "
                             "is refused")
    add_boolean_flag(parser, "--adapter",
                     help="LoRA runs only: write a peft adapter directory instead of the "
                             "merged model")
    add_boolean_flag(parser, "--base_path_relative",
                     help="with --adapter: write base_model_name_or_path relative to the "
                             "adapter directory, to move adapter and base together (default: "
                             "absolute)")
    args = parser.parse_args(argv)
    if args.base_path_relative and not args.adapter:
        raise ValueError("--base_path_relative applies to --adapter exports only; add "
                         "--adapter or drop it")
    configure_logging()
    resolve_model_arguments(args)
    model_dir = resolve_model_dir(args.ckpt)
    if args.adapter and not is_lora_checkpoint(model_dir):
        raise ValueError(f"--adapter: {model_dir} is not a LoRA checkpoint (no {LORA_FILE}); "
                         "drop --adapter to export the model")
    check_out_dir(args.out, args.ckpt, model_dir, args.tokenizer_dir)
    model, _ = load_model(model_dir)
    tokenizer = model_tokenizer(args.ckpt, model.config, model_dir, args.tokenizer_dir)
    export_tokenizer(tokenizer, args.out)
    if args.adapter:
        base_dir = export_lora_run_as_adapter(model_dir, args.out, tokenizer.eos_token_id,
                                              args.base_path_relative)
        print(f"exported the adapters of {model_dir} to {args.out} (base: {base_dir})")
        return
    export_hf(model, args.out, tokenizer.eos_token_id)
    print(f"exported {model_dir} ({model.num_parameters():,} parameters) to {args.out}")


if __name__ == "__main__":
    sys.exit(run_main(main))
