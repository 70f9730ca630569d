"""A pretrained model's own tokenizer (Llama-3, SmolLM, Zephyr, ...), read as data, no remote code.

An HF model directory holds its tokenizer as

    tokenizer.json          the `tokenizers` pipeline, its added (special) tokens, and a
                            post-processor that may add BOS to plain text (Llama's convention)
    tokenizer_config.json   bos/eos/pad/unk token strings, usually the Jinja chat_template
    chat_template.jinja     the chat template, where newer transformers write it
    generation_config.json  eos_token_id (an id or a list): where generation stops

`load_tokenizer(dir)` reads a directory without a "z2all" record into `PretrainedTokenizer`:
plain text is encoded as HF does (the post-processor's BOS included), special-token strings in
text stay text (`TextOnlyTokenizerFast`), and conversations are rendered with the model's own
template by `utils.chat_template.ChatTemplate` (ids and assistant masks). `tokenizer_class`
and `auto_map` are ignored: nothing in the directory is imported or run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from utils.atomic_io import atomic_write_bytes
from utils.chat_template import ChatTemplate

from .text_only import TextOnlyTokenizerFast
from .z2all_tokenizer import CONFIG_FILE, TOKENIZER_FILE, fingerprint_of, write_tokenizer_files

TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG_FILE = "generation_config.json"
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


def _token_string(value: Any) -> str | None:
    """tokenizer_config.json writes a token as a string or as {"content": ..., ...}."""
    return value.get("content") if isinstance(value, dict) else value


class PretrainedTokenizer(TextOnlyTokenizerFast):
    """A pretrained model's tokenizer. Beyond transformers': `fingerprint` (of tokenizer.json's
    ids-deciding parts and the chat template), `kind`
    ("pretrained"), `special_token_ids` ({token: id} of tokenizer.json's added tokens),
    `chat_renderer` (a `ChatTemplate`, or None without a template) and `stop_token_ids`."""

    def __init__(self, directory: Path, config: dict[str, Any], template: str | None,
                 generation_config: dict[str, Any]) -> None:
        special = {key: _token_string(config.get(key)) for key in SPECIAL_TOKEN_KEYS}
        super().__init__(tokenizer_file=str(directory / TOKENIZER_FILE),
                         name_or_path=str(directory), clean_up_tokenization_spaces=False,
                         split_special_tokens=True,
                         **{key: value for key, value in special.items() if value})
        if self.eos_token is None:
            raise ValueError(f"{directory / CONFIG_FILE}: no eos_token; generation could "
                             "never stop")
        if self.pad_token is None:  # (Llama-3 has none; padded positions are masked anyway)
            self.pad_token = self.eos_token
        self.kind = "pretrained"
        # The template decides the ids of a conversation and its masks, as tokenizer.json
        # decides those of a text: both are in the fingerprint (and so in cache keys).
        self.fingerprint = hashlib.sha256(
            f"{fingerprint_of(self.backend_tokenizer)}\n{template}".encode()
        ).hexdigest()[:16]
        self.special_token_ids = {token.content: index for index, token in
                                  self.backend_tokenizer.get_added_tokens_decoder().items()}
        self.source_files = {CONFIG_FILE: config, GENERATION_CONFIG_FILE: generation_config}
        self.template_source = template
        self.chat_renderer = None if template is None else ChatTemplate(
            template, where=str(directory), special_tokens=list(self.special_token_ids),
            variables={key: getattr(self, key) for key in SPECIAL_TOKEN_KEYS},
            encode_texts=self.encode_batch, token_id=self.convert_tokens_to_ids)
        stops = generation_config.get("eos_token_id")
        stops = stops if isinstance(stops, list) else [stops]
        self.stop_token_ids = list(dict.fromkeys(
            [self.eos_token_id, *(int(i) for i in stops if i is not None)]))

    def save_pretrained(self, save_directory: str | Path, **_: Any) -> tuple[str, ...]:
        """The files it was read from, as they were (plus the template where it came from
        its own file), so the copy loads identically here and in transformers."""
        directory = Path(save_directory)
        config = self.source_files[CONFIG_FILE]
        written = write_tokenizer_files(directory, self.backend_tokenizer, config)
        if self.template_source is not None and "chat_template" not in config:
            atomic_write_bytes(directory / TEMPLATE_FILE, self.template_source.encode("utf-8"))
        if self.source_files[GENERATION_CONFIG_FILE]:
            atomic_write_bytes(directory / GENERATION_CONFIG_FILE, json.dumps(
                self.source_files[GENERATION_CONFIG_FILE], indent=2).encode("utf-8"))
            written.append(directory / GENERATION_CONFIG_FILE)
        return tuple(map(str, written))


def load_pretrained_tokenizer(directory: Path) -> PretrainedTokenizer:
    """Read the directory's files (see the module docstring); nothing else is touched."""
    config = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
    template = config.get("chat_template")
    if isinstance(template, list):  # several named templates: the "default" one
        template = {entry.get("name"): entry.get("template") for entry in template}.get("default")
    if template is None and (directory / TEMPLATE_FILE).is_file():
        template = (directory / TEMPLATE_FILE).read_text(encoding="utf-8")
    generation_file = directory / GENERATION_CONFIG_FILE
    generation_config = (json.loads(generation_file.read_text(encoding="utf-8"))
                         if generation_file.is_file() else {})
    return PretrainedTokenizer(directory, config, template, generation_config)
