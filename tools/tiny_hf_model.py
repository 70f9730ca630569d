"""A tiny random Hugging Face Llama directory with its own tokenizer and chat template, offline.

    python -m tools.tiny_hf_model --tokenizer_dir tokenizer/demo_hf --style llama3 --out hf_base

It stands in for a downloaded model (SmolLM, Llama-3, Zephyr, ...) where there is no internet:
the same files in the same format, so "Fine-tune your own model" in the README and the tests
run as written. What it writes:

    config.json + model.safetensors   a random `LlamaForCausalLM` (transformers' own init)
                                      with the style's RoPE (llama3: rope_scaling "llama3")
    tokenizer.json                    the base tokenizer's pipeline + the style's special
                                      tokens (llama3: a post-processor that adds BOS)
    tokenizer_config.json             bos/eos strings and, except zephyr, the chat template
    chat_template.jinja               zephyr's template (where transformers 5 writes it)
    generation_config.json            the style's stop ids

Each template marks the assistant's trained span with transformers' {% generation %} tags,
so `apply_chat_template(..., return_assistant_tokens_mask=True)` gives an independent
reference for z2all's masks (tests/utils/test_chat_template.py).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import tokenizers
import torch
from tokenizers.processors import TemplateProcessing
from transformers import LlamaConfig, LlamaForCausalLM

from utils.cli_errors import run_main
from utils.option_parser import OptionParser

_ASSISTANT = ("{% if message['role'] == 'assistant' %}{% generation %}{{ REPLY }}"
              "{% endgeneration %}{% else %}{{ REPLY }}{% endif %}")


def _template(header: str, reply: str, glue: str, prompt: str, preamble: str = "") -> str:
    return (preamble + "{% for message in messages %}{{ " + header + " }}"
            + _ASSISTANT.replace("REPLY", reply) + glue + "{% endfor %}"
            "{% if add_generation_prompt %}{{ " + prompt + " }}{% endif %}")


STYLES = {
    "chatml": dict(
        specials=["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
        bos=None, eos="<|im_end|>", stops=["<|im_end|>", "<|endoftext|>"], rope=None,
        template=_template("'<|im_start|>' + message['role'] + '\\n'",
                           "message['content'] + '<|im_end|>'", "{{ '\\n' }}",
                           "'<|im_start|>assistant\\n'")),
    "llama3": dict(
        specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"],
        bos="<|begin_of_text|>", eos="<|end_of_text|>", stops=["<|end_of_text|>", "<|eot_id|>"],
        rope={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 256},
        template=_template("'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'",
                           "message['content'] | trim + '<|eot_id|>'", "",
                           "'<|start_header_id|>assistant<|end_header_id|>\\n\\n'",
                           preamble="{{ bos_token }}")),
    "zephyr": dict(
        specials=["<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"],
        bos="<s>", eos="</s>", stops=["</s>"], rope=None,
        template=_template("'<|' + message['role'] + '|>\\n'", "message['content'] + eos_token",
                           "{{ '\\n' }}", "'<|assistant|>\\n'")),
}


def write_pretrained_tokenizer(base_dir: Path, out: Path, style: str) -> int:
    """The tokenizer files above into `out`; returns the vocabulary size."""
    spec = STYLES[style]
    raw = tokenizers.Tokenizer.from_file(str(base_dir / "tokenizer.json"))
    raw.add_special_tokens([tokenizers.AddedToken(token, special=True, normalized=False)
                            for token in spec["specials"]])
    if style == "llama3":
        bos_id = raw.token_to_id(spec["bos"])
        raw.post_processor = TemplateProcessing(single=f"{spec['bos']} $A",
                                                pair=f"{spec['bos']} $A $B",
                                                special_tokens=[(spec["bos"], bos_id)])
    out.mkdir(parents=True, exist_ok=True)
    raw.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": spec["bos"],
              "eos_token": spec["eos"], "clean_up_tokenization_spaces": False}
    if style == "zephyr":
        (out / "chat_template.jinja").write_text(spec["template"], encoding="utf-8")
    else:
        config["chat_template"] = spec["template"]
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    stops = [raw.token_to_id(token) for token in spec["stops"]]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}))
    return raw.get_vocab_size(with_added_tokens=True)


def main(argv: list[str] | None = None) -> None:
    parser = OptionParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer_dir", required=True,
                        help="base tokenizer (e.g. tokenizer/demo_hf from make demo)")
    parser.add_argument("--style", choices=sorted(STYLES), default="llama3")
    parser.add_argument("--out", required=True, help="the HF model directory to write")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not (Path(args.tokenizer_dir) / "tokenizer.json").is_file():
        raise ValueError(f"--tokenizer_dir {args.tokenizer_dir}: no tokenizer.json there")
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    vocab_size = write_pretrained_tokenizer(Path(args.tokenizer_dir), out, args.style)
    stops = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    bos = STYLES[args.style]["bos"]
    torch.manual_seed(args.seed)
    rope = STYLES[args.style]["rope"] or {"rope_type": "default", "rope_theta": 10000.0}
    # (save_pretrained rewrites generation_config.json from these ids: the same stops)
    config = LlamaConfig(bos_token_id=bos and tokenizers.Tokenizer.from_file(
                             str(out / "tokenizer.json")).token_to_id(bos),
                         eos_token_id=stops, pad_token_id=None,
                         vocab_size=vocab_size, hidden_size=128, intermediate_size=352,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, rope_parameters=rope,
                         tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(out)
    print(f"wrote a random {args.style}-style LlamaForCausalLM (vocabulary {vocab_size}) "
          f"and its tokenizer to {out}")


if __name__ == "__main__":
    sys.exit(run_main(main))
