"""`python -m tokenizer.show_encodings DIR [DIR ...]`: how saved tokenizers cut a few samples.

For each tokenizer and sample: the tokens (each shown as the text it decodes to, "|" between
tokens; a token holding only part of a multi-byte character is shown as its vocabulary piece),
the ids, and tokens per character (lower = more text per token = cheaper training and context).
"""

from __future__ import annotations

import sys

from transformers import PreTrainedTokenizerBase

from tokenizer import load_tokenizer
from utils.cli_errors import run_main
from utils.option_parser import OptionParser

SAMPLES = {
    "English": "The quick brown fox jumps over the lazy dog.",
    "Chinese": "周末，我的朋友在公园里学习中文。",
    "code": "def add(a, b):\n    return a + b\n",
    "number": "In 2024 it cost 1234567.89 dollars.",
    "injection": "user text <|im_end|> is not a special token",
}


def token_texts(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[str]:
    """Each token as the text it decodes to, or its vocabulary piece when that text is only
    part of a character (decoding one byte of a multi-byte character gives U+FFFD)."""
    texts = []
    for token_id in ids:
        text = tokenizer.decode([token_id])
        texts.append(tokenizer.convert_ids_to_tokens(token_id) if "\ufffd" in text else text)
    return texts


def show(directory: str) -> dict[str, float]:
    """Print the samples' encodings; returns tokens per character by sample."""
    tokenizer = load_tokenizer(directory)
    print(f"\n== {directory}: {tokenizer.kind}, V={len(tokenizer)}, specials "
          f"{tokenizer.special_token_ids}, fingerprint {tokenizer.fingerprint}")
    ratios = {}
    for name, text in SAMPLES.items():
        ids = tokenizer.encode(text)
        ratios[name] = len(ids) / len(text)
        shown = "|".join(piece.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
                         for piece in token_texts(tokenizer, ids))
        exact = "exact" if tokenizer.decode(ids) == text else "NOT EXACT"
        print(f"{name:>9}: {len(ids)} tokens for {len(text)} chars = {ratios[name]:.2f} "
              f"tokens/char, round trip {exact}\n{'tokens:':>18} {shown}\n{'ids:':>18} {ids}")
    return ratios


def main(argv: list[str] | None = None) -> None:
    parser = OptionParser(description=__doc__.split("\n")[0])
    parser.add_argument("directories", nargs="+", help="saved tokenizer directories")
    directories = parser.parse_args(argv).directories
    table = {directory: show(directory) for directory in directories}
    print(f"\ntokens per character  {'':>9} " + " ".join(f"{d[-24:]:>24}" for d in directories))
    for name in SAMPLES:
        print(f"{name:>31} " + " ".join(f"{table[d][name]:>24.2f}" for d in directories))


if __name__ == "__main__":
    sys.exit(run_main(main))
