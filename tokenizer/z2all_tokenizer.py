"""z2all's tokenizer: a standard `tokenizer.json`, read through a class that keeps text as text.

A saved tokenizer directory holds data only, in the format every HF client reads:

    tokenizer.json         the whole pipeline of HF `tokenizers` (pre-tokenizer, BPE model,
                           decoder) + the 3 special tokens, added after the base vocabulary
    tokenizer_config.json  tokenizer_class PreTrainedTokenizerFast, eos/pad, the ChatML
                           chat_template, our record under "z2all" (kind, layout, fingerprint)

so `AutoTokenizer.from_pretrained(dir)` loads it with no remote code, and `load_tokenizer(dir)`
loads it into `Z2allTokenizer` below, which lives in z2all: nothing in a tokenizer folder is ever
imported or run. Both kinds share this format: the byte-level BPE is a `tokenizers` model already;
the sentencepiece BPE is converted to one (tokenizer/sentencepiece_bpe.py, same ids).

The sentencepiece kind also keeps the library's own model, `sentencepiece.model`, beside them.
HF's BPE runs that model at about a third of sentencepiece's speed, so when the file is there
`encode_batch` (the bulk path: pretokenizing) calls `SentencePieceProcessor.encode` on it. The
file is used only if converting it again gives this very tokenizer.json (same fingerprint), so
both paths give the same ids; a damaged or foreign one is refused. A directory without it
(saved by `save_pretrained`, or copied without it) encodes through tokenizer.json, as before.

Vocabulary layout (docs/design.md §2.2), worked example V = 512:

    ids 0 .. 508   base vocabulary (bytes, merges; never a special token)
    id  509        <|endoftext|>   document separator, EOS and pad (there is no BOS)
    id  510        <|im_start|>    ChatML: a turn starts
    id  511        <|im_end|>      ChatML: a turn ends

Two conventions for text that merely *contains* a special-token string such as "<|im_end|>":
- HF's (AutoTokenizer on the same directory): it becomes the special id, as in every HF chat
  model;
- ours (`Z2allTokenizer`: encode, __call__, tokenize, encode_batch): it stays ordinary text, on
  every path and whatever the caller passes (`split_special_tokens` is always on). Only
  utils/conversation.py inserts special ids, by id, so a user cannot forge a turn boundary.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import sentencepiece
import tokenizers

from utils.atomic_io import atomic_write_bytes
from utils.conversation import CHAT_TEMPLATE

from .sentencepiece_bpe import sentencepiece_to_tokenizers
from .text_only import TextOnlyTokenizerFast

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ENDOFTEXT = SPECIAL_TOKENS[0]
KINDS = ("byte_level_bpe", "sentencepiece_bpe")
FORMAT_NAME, FORMAT_VERSION = "z2all-tokenizer", 2
TOKENIZER_FILE, CONFIG_FILE = "tokenizer.json", "tokenizer_config.json"
SENTENCEPIECE_FILE = "sentencepiece.model"  # sentencepiece kind only: the library's own model
# The parts of tokenizer.json that decide ids and decoded text (not padding/truncation state).
FINGERPRINTED_PARTS = ("added_tokens", "normalizer", "pre_tokenizer", "model", "decoder")


def with_special_tokens(raw: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    """The raw library model plus our 3 special tokens at ids B, B+1, B+2 (B = base size)."""
    if raw.get_added_tokens_decoder():
        raise ValueError("the raw tokenizer must not contain added tokens")
    clashes = [token for token in SPECIAL_TOKENS if raw.token_to_id(token) is not None]
    if clashes:  # adding it would reuse the base id: text could then produce the special id
        raise ValueError(f"the base vocabulary contains the special token(s) {clashes}; train "
                         "the tokenizer with tokenizer.train_tokenizer")
    tokenizer = tokenizers.Tokenizer.from_str(raw.to_str())
    tokenizer.add_special_tokens([
        tokenizers.AddedToken(token, special=True, normalized=False, lstrip=False, rstrip=False)
        for token in SPECIAL_TOKENS])
    return tokenizer


def fingerprint_of(tokenizer: tokenizers.Tokenizer) -> str:
    """Stable short hash (16 hex digits) of what decides the ids and the decoded text."""
    parts = json.loads(tokenizer.to_str())
    canonical = json.dumps({key: parts[key] for key in FINGERPRINTED_PARTS}, sort_keys=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


class Z2allTokenizer(TextOnlyTokenizerFast):
    """Our own tokenizers: `TextOnlyTokenizerFast` (special-token strings stay text) with the
    vocabulary layout checked.

    Extras beyond transformers': `encode_batch(texts)`, `fingerprint`, `special_token_ids`
    ({token: id}), `kind`, `z2all_record` (what tokenizer_config.json holds under "z2all") and
    `native_sentencepiece` (the sentencepiece kind's own processor, or None).
    Build one with `Z2allTokenizer(tokenizer_object=with_special_tokens(raw), z2all={"kind":
    ...}, sentencepiece_model=...)`, or load a saved one with `tokenizer.load_tokenizer(dir)`.
    """

    def __init__(self, *args: Any, z2all: dict, sentencepiece_model: bytes | None = None,
                 **kwargs: Any):
        for fixed in ("split_special_tokens", "eos_token", "pad_token", "bos_token",
                      "chat_template", "clean_up_tokenization_spaces"):
            kwargs.pop(fixed, None)
        super().__init__(*args, eos_token=ENDOFTEXT, pad_token=ENDOFTEXT,
                         chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False,
                         split_special_tokens=True, **kwargs)
        source = kwargs.get("name_or_path") or "the tokenizer"
        self.special_token_ids = self._check_layout(source)
        self.kind = z2all.get("kind")
        if self.kind not in KINDS:
            raise ValueError(f"{source}: unknown tokenizer kind {self.kind!r} (expected {KINDS})")
        self.fingerprint = fingerprint_of(self.backend_tokenizer)
        base_size = self.backend_tokenizer.get_vocab_size(with_added_tokens=False)
        self.z2all_record = {
            "format": FORMAT_NAME, "version": FORMAT_VERSION, "kind": self.kind,
            "vocab_size": len(self), "base_vocab_size": base_size,
            "special_token_ids": dict(self.special_token_ids),
            "eos_token_id": self.eos_token_id, "pad_token_id": self.pad_token_id,
            "bos_token_id": None, "fingerprint": self.fingerprint,
            "training": z2all.get("training")}
        self._check_saved_record(z2all, source)
        self.native_sentencepiece = (None if sentencepiece_model is None else
                                     self._matching_sentencepiece(sentencepiece_model, source))

    def _matching_sentencepiece(self, model: bytes, source: str
                                ) -> sentencepiece.SentencePieceProcessor:
        """sentencepiece's processor on `model`, which must be the very model this
        tokenizer.json was converted from: converting it again gives the same fingerprint."""
        where = f"{source}: {SENTENCEPIECE_FILE}"
        if self.kind != "sentencepiece_bpe":
            raise ValueError(f"{where} found beside a {self.kind} tokenizer: remove it")
        try:
            processor = sentencepiece.SentencePieceProcessor(model_proto=model)
            converted = with_special_tokens(sentencepiece_to_tokenizers(model))
        except (RuntimeError, ValueError, OSError) as error:
            raise ValueError(f"{where} cannot be read ({' '.join(str(error).split())}): "
                             "delete it (tokenizer.json alone encodes the same ids, slower) "
                             "or retrain with python -m tokenizer.train_tokenizer") from None
        if fingerprint_of(converted) != self.fingerprint:
            raise ValueError(f"{where} is not the model {TOKENIZER_FILE} was converted from: "
                             "the directory is inconsistent; delete it or retrain with "
                             "python -m tokenizer.train_tokenizer")
        return processor

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, as ordinary text. The sentencepiece kind runs the library
        itself when its model is loaded (`native_sentencepiece`): the same ids (checked at
        load, and by tests/tokenizer/test_native_sentencepiece.py), at sentencepiece's speed."""
        if self.native_sentencepiece is None or isinstance(texts, str):
            return super().encode_batch(texts)
        return self.native_sentencepiece.encode(list(texts))

    def _check_layout(self, source: str) -> dict[str, int]:
        """The 3 specials sit right after the base vocabulary, and nothing else was added."""
        backend = self.backend_tokenizer
        base_size = backend.get_vocab_size(with_added_tokens=False)
        added = {index: token.content for index, token in
                 backend.get_added_tokens_decoder().items()}
        expected = {base_size + i: token for i, token in enumerate(SPECIAL_TOKENS)}
        if added != expected:
            raise ValueError(f"{source}: tokenizer.json must add exactly {expected} after the "
                             f"base vocabulary; it adds {added}")
        processor = backend.post_processor
        if processor is not None and processor.num_special_tokens_to_add(False):
            raise ValueError(f"{source}: tokenizer.json's post-processor adds tokens; z2all "
                             "tokenizers add none (no BOS)")
        return {token: index for index, token in expected.items()}

    def _check_saved_record(self, saved: dict, source: str) -> None:
        """On load: the record must describe this very tokenizer.json, or we refuse loudly."""
        if "version" in saved and saved["version"] != FORMAT_VERSION:
            raise ValueError(f"{source}: tokenizer format version {saved['version']}, this "
                             f"z2all reads {FORMAT_VERSION}: retrain it with "
                             "python -m tokenizer.train_tokenizer")
        for key in ("format", "vocab_size", "special_token_ids", "fingerprint"):
            if key in saved and saved[key] != self.z2all_record[key]:
                raise ValueError(f"{source}: {CONFIG_FILE} says {key}={saved[key]!r} but "
                                 f"{TOKENIZER_FILE} gives {self.z2all_record[key]!r}; the "
                                 "directory is inconsistent")

    # --- saving: the two standard files, nothing else ----------------------------------------
    def save_pretrained(self, save_directory: str | os.PathLike, **_: Any) -> tuple[str, ...]:
        """Write tokenizer.json and tokenizer_config.json (each atomically) for any HF client."""
        config = {"tokenizer_class": "PreTrainedTokenizerFast",
                  "eos_token": ENDOFTEXT, "pad_token": ENDOFTEXT, "bos_token": None,
                  "clean_up_tokenization_spaces": False,
                  "chat_template": CHAT_TEMPLATE,
                  "z2all": self.z2all_record}
        return tuple(map(str, write_tokenizer_files(Path(save_directory),
                                                    self.backend_tokenizer, config)))


def write_tokenizer_files(directory: Path, backend: tokenizers.Tokenizer,
                          config: dict[str, Any]) -> list[Path]:
    """The two files every HF client reads, each atomically, into `directory` (created):
    tokenizer.json (the `tokenizers` model) and tokenizer_config.json (`config`). Both kinds
    of tokenizer save through here. Returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(directory / TOKENIZER_FILE, backend.to_str(pretty=True).encode("utf-8"))
    atomic_write_bytes(directory / CONFIG_FILE,
                       json.dumps(config, indent=2, ensure_ascii=False).encode("utf-8"))
    return [directory / TOKENIZER_FILE, directory / CONFIG_FILE]
