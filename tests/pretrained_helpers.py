"""Pretrained-style tokenizer directories built offline (tools/tiny_hf_model.py: the tiny
byte-level BPE of tests/conftest.py with ChatML, Llama-3-with-BOS or Zephyr special tokens and
chat template, whose {% generation %} tags make transformers' assistant masks a reference),
and random conversations to render with them."""

from __future__ import annotations

import random
from pathlib import Path

from tools.tiny_hf_model import STYLES, write_pretrained_tokenizer

__all__ = ["STYLES", "make_pretrained_tokenizer_dir", "random_conversation", "random_text"]


def make_pretrained_tokenizer_dir(base_dir: Path, out: Path, style: str) -> Path:
    write_pretrained_tokenizer(base_dir, out, style)
    return out


_WORDS = ["hello", "the model", "我们的", "日本語", "😀", "(x)", "**bold**", "12345", "def f():",
          "  indented", "tab\there", "end."]
_SPACES = [" ", "  ", "\n", "\n\n", "\t", ""]


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(_WORDS) + rng.choice(_SPACES) for _ in range(rng.randint(1, 6)))


def random_conversation(rng: random.Random, injected: list[str] = ()) -> list[dict]:
    """system? (user, assistant)+; `injected` strings are sprinkled into the contents."""
    def content() -> str:
        text = random_text(rng)
        if injected and rng.random() < 0.5:
            cut = rng.randint(0, len(text))
            text = text[:cut] + rng.choice(injected) + text[cut:]
        return text
    messages = [{"role": "system", "content": content()}] if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 3)):
        messages += [{"role": "user", "content": content()},
                     {"role": "assistant", "content": content()}]
    return messages
