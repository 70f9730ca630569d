"""Generate text from a trained model, streaming tokens to stdout as they are produced.

    python generate.py --ckpt out/<run> --prompt "Once upon a time"
    python generate.py --ckpt out/<run> --chat --prompt "What is 2 + 3?" --temperature 0
    python generate.py --ckpt hf_model/ --tokenizer_dir tokenizer/demo_hf --prompt "..."

`--ckpt` is a run dir (its newest valid checkpoint), a checkpoint dir, a `save_pretrained`
dir, or a Hugging Face Llama dir. The tokenizer defaults to the one the run trained with
(`tokenizer_dir` in the run's config.json). Plain prompts start with `<|endoftext|>`, the
document separator the model saw before every pretraining document; `--chat` wraps the prompt
in the ChatML template and stops at `<|im_end|>`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

import torch

from model.loading import load_model
from tokenizer import load_tokenizer
from utils.cli_errors import run_main
from utils.conversation import build_generation_prompt
from utils.option_checks import raise_problems, range_problem


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True,
                        help="run dir, checkpoint dir, save_pretrained dir or HF Llama dir")
    parser.add_argument("--tokenizer_dir", default=None,
                        help="default: tokenizer_dir from the run's config.json")
    parser.add_argument("--prompt", default="", help="text to continue (or the user message)")
    parser.add_argument("--chat", action="store_true",
                        help="format as a chat turn (ChatML) and stop at <|im_end|>")
    parser.add_argument("--system", default=None, help="system message for --chat")
    parser.add_argument("--max_new_tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    parser.add_argument("--top_k", type=int, default=None, help="sample among the k best")
    parser.add_argument("--top_p", type=float, default=None, help="nucleus sampling mass")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    raise_problems([
        range_problem("--max_new_tokens", args.max_new_tokens, 1),
        range_problem("--temperature", args.temperature, 0),
        range_problem("--top_k", args.top_k, 1),
        range_problem("--top_p", args.top_p, 0, 1, low_open=True),
    ])
    return args


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
    raise ValueError(f"{ckpt}: no tokenizer recorded; pass --tokenizer_dir")


def prompt_ids(tokenizer, args: argparse.Namespace) -> tuple[list[int], int]:
    """(prompt token ids, the id that ends generation)."""
    if not args.chat:
        return [tokenizer.eos_token_id, *tokenizer.encode(args.prompt)], tokenizer.eos_token_id
    messages = [{"role": "user", "content": args.prompt}]
    ids = build_generation_prompt(tokenizer, messages, system=args.system)
    return ids, tokenizer.convert_tokens_to_ids("<|im_end|>")


def print_streaming(tokenizer, new_tokens: Iterable[int], stop_id: int) -> list[int]:
    """Print text as tokens arrive. A multi-byte character (Chinese, emoji) can span several
    tokens; while the decoded text ends in U+FFFD (an incomplete byte sequence) we wait."""
    generated: list[int] = []
    printed = ""
    for token in new_tokens:
        if token == stop_id:
            break
        generated.append(token)
        text = tokenizer.decode(generated)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[len(printed):])
            sys.stdout.flush()
            printed = text
    sys.stdout.write(tokenizer.decode(generated)[len(printed):] + "\n")
    return generated


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model, model_dir = load_model(args.ckpt)
    tokenizer_dir = args.tokenizer_dir or default_tokenizer_dir(Path(args.ckpt), model_dir)
    tokenizer = load_tokenizer(tokenizer_dir)
    device = torch.device(args.device)
    # bf16 on GPUs; fp32 on CPU, where bf16 matmuls are slower.
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = model.to(device=device, dtype=dtype).eval()
    ids, stop_id = prompt_ids(tokenizer, args)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    stream = model.stream_generate(
        torch.tensor([ids], device=device), args.max_new_tokens, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, eos_token_id=stop_id, generator=generator)
    if not args.chat:
        sys.stdout.write(args.prompt)
    print_streaming(tokenizer, (int(token[0]) for token in stream), stop_id)


if __name__ == "__main__":
    sys.exit(run_main(main))
