"""Generate text from a trained model, streaming tokens to stdout as they are produced.

    python generate.py --ckpt out/<run> --prompt "Once upon a time"
    python generate.py --ckpt out/<run> --chat --prompt "What is 2 + 3?" --temperature 0
    python generate.py --ckpt hf_model/ --tokenizer_dir tokenizer/demo_hf --prompt "..."
    HF_HUB_OFFLINE=1 python generate.py --ckpt HuggingFaceTB/SmolLM2-135M --prompt "..."

`--ckpt` is a run dir (its newest valid checkpoint), a checkpoint dir, a `save_pretrained`
dir, or a Hugging Face Llama dir. The tokenizer defaults to the one the run trained with
(`tokenizer_dir` in the run's config.json). A plain prompt is its text's ids and nothing else
(no BOS, as in pretraining data and in the HF export, so HF's greedy output is the same); an
empty prompt starts from `<|endoftext|>`, which precedes every pretraining document. `--chat`
wraps the prompt in the ChatML template. Generation stops at `<|endoftext|>` or `<|im_end|>`
(the end of a document or of a turn; the HF export's generation_config.json says the same).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

import torch

from model.loading import (
    add_model_arguments,
    check_device,
    load_for_inference,
    resolve_model_arguments,
)
from utils.boolean_flags import add_boolean_flag
from utils.cli_errors import run_main
from utils.conversation import build_generation_prompt, stop_ids
from utils.log_setup import configure_logging
from utils.option_checks import raise_problems, range_problem
from utils.option_parser import OptionParser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OptionParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--prompt", default="", help="text to continue (or the user message)")
    add_boolean_flag(parser, "--chat",
                     help="format as a chat turn (ChatML) and stop at <|im_end|>")
    parser.add_argument("--system", default=None, help="system message for --chat")
    parser.add_argument("--max_new_tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    parser.add_argument("--top_k", type=int, default=None, help="sample among the k best")
    parser.add_argument("--top_p", type=float, default=None, help="nucleus sampling mass")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    args = parser.parse_args(argv)
    raise_problems([
        range_problem("--max_new_tokens", args.max_new_tokens, 1),
        range_problem("--temperature", args.temperature, 0),
        range_problem("--top_k", args.top_k, 1),
        range_problem("--top_p", args.top_p, 0, 1, low_open=True),
    ])
    check_device(args.device)
    return args


def prompt_ids(tokenizer, args: argparse.Namespace) -> list[int]:
    """The prompt's token ids: the plain text's own, or the ChatML generation prompt."""
    if not args.chat:
        return tokenizer.encode(args.prompt) or [tokenizer.eos_token_id]
    messages = [{"role": "user", "content": args.prompt}]
    return build_generation_prompt(tokenizer, messages, system=args.system)


def print_streaming(tokenizer, new_tokens: Iterable[int], stop: list[int],
                    prefix: str = "") -> list[int]:
    """Print `prefix` (a plain prompt) and then the text as tokens arrive. A multi-byte
    character (Chinese, emoji) can span several tokens; while the decoded text ends in U+FFFD
    (an incomplete byte sequence) we wait. Nothing is written before the first token has
    arrived: the model's first forward logs its kernel line (on stderr), which would otherwise
    land inside the output line on a terminal or in `2>&1`."""
    generated: list[int] = []
    printed, pending = "", prefix
    for token in new_tokens:
        if token in stop:
            break
        generated.append(token)
        text = tokenizer.decode(generated)
        if not text.endswith("\ufffd"):
            sys.stdout.write(pending + text[len(printed):])
            sys.stdout.flush()
            printed, pending = text, ""
    sys.stdout.write(pending + tokenizer.decode(generated)[len(printed):] + "\n")
    return generated


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    resolve_model_arguments(args)
    configure_logging()
    model, tokenizer = load_for_inference(args)
    device = torch.device(args.device)
    ids, stop = prompt_ids(tokenizer, args), stop_ids(tokenizer)
    room = model.config.max_position_embeddings - len(ids)
    if args.max_new_tokens > room:
        raise ValueError(f"--max_new_tokens {args.max_new_tokens}: the prompt has {len(ids)} "
                         f"tokens and the model's context is {model.config.max_position_embeddings}"
                         f", so at most {max(room, 0)} new tokens fit")
    generator = torch.Generator(device=device).manual_seed(args.seed)
    stream = model.stream_generate(
        torch.tensor([ids], device=device), args.max_new_tokens, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, eos_token_id=stop, generator=generator,
        real_vocab_size=len(tokenizer))  # the model's padding ids are no tokens
    print_streaming(tokenizer, (int(token[0]) for token in stream), stop,
                    prefix="" if args.chat else args.prompt)


if __name__ == "__main__":
    sys.exit(run_main(main))
