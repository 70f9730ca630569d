"""Export a z2all model as a Hugging Face `LlamaForCausalLM` directory.

    python -m model.convert_to_hf --ckpt out/<run> --out hf_model/   [--tokenizer_dir DIR]

`--ckpt` takes a run dir (its newest valid checkpoint), one checkpoint dir, any
`save_pretrained` dir or an HF Llama dir. The result is a standard HF Llama directory that loads
offline, with no remote code: `config.json` + `model.safetensors` (weights keep their dtype) for
`LlamaForCausalLM.from_pretrained("hf_model/")`, and the model's own tokenizer (found as
model/run_tokenizer.py says; an explicit --tokenizer_dir must match it) for `AutoTokenizer`.
A model fine-tuned from an HF directory gets that directory's config.json back unchanged and
its tokenizer files as they were (template, generation_config.json). A z2all tokenizer is
written as `tokenizer.json` + `tokenizer_config.json` with the ChatML chat_template, and a
`generation_config.json` (stop at <|endoftext|> or <|im_end|>, pad with <|endoftext|>, as
generate.py does). No BOS on either side: HF's greedy output equals generate.py's. The mapping
(and why no RoPE permutation is needed) is in `model/hf_llama_mapping.py`; the reverse direction
is `Z2allForCausalLM.from_hf(dir)`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from safetensors.torch import save

from model.hf_llama_mapping import config_to_hf, state_dict_to_hf
from model.loading import load_model
from model.modeling_z2all import CONFIG_FILE, WEIGHTS_FILE, Z2allForCausalLM
from model.run_tokenizer import model_tokenizer
from tokenizer import PretrainedTokenizer
from tokenizer.z2all_tokenizer import Z2allTokenizer
from utils.atomic_io import atomic_write_bytes, atomic_write_json
from utils.cli_errors import run_main
from utils.conversation import IM_END
from utils.log_setup import configure_logging

GENERATION_CONFIG_FILE = "generation_config.json"


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True,
                        help="run dir, checkpoint dir, save_pretrained dir or HF Llama dir")
    parser.add_argument("--out", required=True, help="output directory for the HF model")
    parser.add_argument("--tokenizer_dir", default=None,
                        help="default: the model's own (model/run_tokenizer.py); another one "
                             "is refused")
    args = parser.parse_args(argv)
    configure_logging()
    model, model_dir = load_model(args.ckpt)
    tokenizer = model_tokenizer(args.ckpt, model.config, model_dir, args.tokenizer_dir)
    export_tokenizer(tokenizer, args.out)
    export_hf(model, args.out, tokenizer.eos_token_id)
    print(f"exported {model_dir} ({model.num_parameters():,} parameters) to {args.out}")


if __name__ == "__main__":
    sys.exit(run_main(main))
