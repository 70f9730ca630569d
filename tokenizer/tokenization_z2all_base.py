"""What both z2all tokenizers share: three special tokens kept *outside* the raw tokenizer library.

A z2all tokenizer wraps a raw library model (HF `tokenizers` byte-level BPE, or `sentencepiece`
BPE) that knows only the base vocabulary, ids 0 .. B-1. The special tokens are added here, right
after it, so `len(tokenizer)` = V = B + 3 (docs/design.md §2.2). Worked example, V = 512:

    ids 0 .. 508   base vocabulary (bytes, merges; never a special token)
    id  509        <|endoftext|>   document separator, EOS and pad (there is no BOS)
    id  510        <|im_start|>    ChatML: a turn starts
    id  511        <|im_end|>      ChatML: a turn ends

Security: text that merely *contains* "<|im_end|>" must never become the special id, or a user
could forge chat turns. Since the raw library does not know the special tokens, it cannot
produce their ids; and every public encode path here (`encode`, `__call__`, `tokenize`,
`encode_batch`) goes straight to the raw library, skipping the splitting on special-token
strings that transformers' `PreTrainedTokenizer` does by default. Only the chat template
(utils/conversation.py) inserts special ids, by id.

Self-contained: `save_pretrained(dir)` copies this file and the subclass's file into `dir`
(transformers' remote-code mechanism: `auto_map` in tokenizer_config.json), so that
`AutoTokenizer.from_pretrained(dir, trust_remote_code=True)` works from any working directory.
Hence these files import nothing from z2all.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

from transformers import AddedToken, PreTrainedTokenizer

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ENDOFTEXT = SPECIAL_TOKENS[0]
FORMAT_NAME, FORMAT_VERSION = "z2all-tokenizer", 1


class Z2allTokenizerBase(PreTrainedTokenizer):
    """Special tokens, safe encode paths, exact decode, fingerprint; subclasses add the library.

    Public extras beyond transformers': `encode_batch(texts)`, `fingerprint` (16 hex digits),
    `special_token_ids` ({token: id}), `kind`, and `z2all_record` (saved in tokenizer_config.json
    under "z2all": vocabulary layout, fingerprint, how it was trained).

    A subclass sets `kind` and `vocab_files_names = {"model_file": <file name>}` and implements
    `_load_model(bytes)`, `_base_pieces()`, `_encode_ordinary_batch(texts)` and
    `_decode_ordinary(ids)`.
    """

    kind: str = ""
    model_input_names = ["input_ids", "attention_mask"]
    # save_pretrained copies our code next to the vocabulary and writes `auto_map`.
    _auto_class = "AutoTokenizer"

    def __init__(self, model_file: str | os.PathLike, z2all: dict | None = None, **kwargs: Any):
        with open(model_file, "rb") as handle:
            self._model_bytes = handle.read()
        self._load_model(self._model_bytes)
        self._id_to_piece: list[str] = self._base_pieces()
        self._piece_to_id = {piece: index for index, piece in enumerate(self._id_to_piece)}
        base_size = len(self._id_to_piece)
        self.special_token_ids = {token: base_size + i for i, token in enumerate(SPECIAL_TOKENS)}
        self._special_id_to_token = {i: token for token, i in self.special_token_ids.items()}
        # A base piece spelled like a special token would make `tokenize` -> convert_tokens_to_ids
        # return the special id. Our trainers never form one: the byte-level regex and
        # sentencepiece's split by Unicode script both keep "<|" apart from "im".
        clashes = [token for token in SPECIAL_TOKENS if token in self._piece_to_id]
        if clashes:
            raise ValueError(f"{model_file}: base vocabulary contains the special token(s) "
                             f"{clashes}; text could then produce them. Train it with "
                             "tokenizer.train_tokenizer.")
        self.fingerprint = self._compute_fingerprint()
        self.z2all_record = self._make_record((z2all or {}).get("training"))
        self._check_saved_record(z2all, kwargs.get("added_tokens_decoder"), model_file)

        # Our specials at fixed ids, registered *before* the base class would append them itself.
        self._added_tokens_decoder = {
            index: AddedToken(token, special=True, normalized=False, lstrip=False, rstrip=False)
            for token, index in self.special_token_ids.items()}
        for fixed in ("added_tokens_decoder", "eos_token", "pad_token", "bos_token", "unk_token",
                      "extra_special_tokens", "split_special_tokens"):
            kwargs.pop(fixed, None)
        super().__init__(eos_token=ENDOFTEXT, pad_token=ENDOFTEXT,
                         extra_special_tokens=list(SPECIAL_TOKENS[1:]),
                         split_special_tokens=True, z2all=self.z2all_record, **kwargs)

    # --- provided by each library's subclass -------------------------------------------------
    def _load_model(self, model_bytes: bytes) -> None:
        raise NotImplementedError

    def _base_pieces(self) -> list[str]:
        """Every base-vocabulary piece, in id order."""
        raise NotImplementedError

    def _encode_ordinary_batch(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def _decode_ordinary(self, ids: list[int]) -> str:
        raise NotImplementedError

    # --- the contract's extras ---------------------------------------------------------------
    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, as ordinary text (never special ids): the library's own batch
        encoder (Rust / C++, multi-threaded), with no Python work per token."""
        if isinstance(texts, str):
            raise TypeError("encode_batch takes a list of texts; use encode(text) for one text")
        return self._encode_ordinary_batch(list(texts))

    def _compute_fingerprint(self) -> str:
        """Stable short hash of what decides the ids: kind, model file bytes, special tokens."""
        digest = hashlib.sha256(self.kind.encode())
        digest.update(self._model_bytes)
        digest.update(json.dumps(self.special_token_ids, sort_keys=True).encode())
        return digest.hexdigest()[:16]

    def _make_record(self, training: dict | None) -> dict:
        """What tokenizer_config.json records under "z2all" (read by people and by our loader)."""
        return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "kind": self.kind,
                "vocab_size": len(self._id_to_piece) + len(SPECIAL_TOKENS),
                "base_vocab_size": len(self._id_to_piece),
                "special_token_ids": dict(self.special_token_ids),
                "eos_token_id": self.special_token_ids[ENDOFTEXT],
                "pad_token_id": self.special_token_ids[ENDOFTEXT], "bos_token_id": None,
                "fingerprint": self.fingerprint, "training": training}

    def _check_saved_record(self, saved: dict | None, saved_added_tokens: dict | None,
                            model_file: str | os.PathLike) -> None:
        """On load: the config must describe this very model file, or we refuse loudly."""
        if saved is not None:
            for key in ("format", "version", "kind", "vocab_size", "special_token_ids",
                        "fingerprint"):
                if key in saved and saved[key] != self.z2all_record[key]:
                    raise ValueError(f"{model_file}: tokenizer_config.json says {key}="
                                     f"{saved[key]!r} but the model file gives "
                                     f"{self.z2all_record[key]!r}; the directory is inconsistent")
        for index, token in (saved_added_tokens or {}).items():
            if self._special_id_to_token.get(int(index)) != str(token):
                raise ValueError(f"{model_file}: tokenizer_config.json puts {str(token)!r} at id "
                                 f"{index}, but z2all's specials are {self.special_token_ids}")

    # --- transformers' PreTrainedTokenizer interface -----------------------------------------
    @property
    def vocab_size(self) -> int:
        """Base vocabulary size B (transformers' meaning); `len(tokenizer)` is B + 3."""
        return len(self._id_to_piece)

    def get_vocab(self) -> dict[str, int]:
        return {**self._piece_to_id, **self.special_token_ids}

    def tokenize(self, text: str, **kwargs: Any) -> list[str]:
        """Pieces of `text` read as ordinary text. Unlike the base class, a special-token string
        inside `text` is not cut out as a special token (`split_special_tokens` is ignored)."""
        return [self._id_to_piece[index] for index in self._encode_ordinary_batch([text])[0]]

    def _encode_plus(self, text: Any, text_pair: Any = None, **kwargs: Any):
        # Fast path for plain strings: ids straight from the library, no pieces in between. The
        # other input forms go through `tokenize` above, which is just as safe. An empty string
        # stays "" (an empty id list would read as an empty *batch*).
        if text_pair is None and not kwargs.get("is_split_into_words", False):
            if isinstance(text, str) and text:
                text = self._encode_ordinary_batch([text])[0]
            elif (isinstance(text, (list, tuple)) and text
                  and all(isinstance(item, str) for item in text)):
                text = [ids or "" for ids in self._encode_ordinary_batch(list(text))]
        return super()._encode_plus(text, text_pair=text_pair, **kwargs)

    def _convert_token_to_id(self, token: str) -> int | None:
        return self._piece_to_id.get(token)

    def _convert_id_to_token(self, index: int) -> str:
        return self._id_to_piece[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self._decode(self.convert_tokens_to_ids(tokens))

    def _decode(self, token_ids: int | list[int], skip_special_tokens: bool = False,
                clean_up_tokenization_spaces: bool | None = None, **kwargs: Any) -> str:
        """Exact inverse of encoding: runs of ordinary ids go to the library's decoder, special
        ids become their strings (or vanish with skip_special_tokens). No space clean-up ever."""
        ids = [token_ids] if isinstance(token_ids, int) else [int(i) for i in token_ids]
        if ids and (min(ids) < 0 or max(ids) >= len(self)):
            bad = next(i for i in ids if not 0 <= i < len(self))
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {len(self)})")
        parts, ordinary_run = [], []
        for token_id in ids:
            special = self._special_id_to_token.get(token_id)
            if special is None:
                ordinary_run.append(token_id)
                continue
            parts.append(self._decode_ordinary(ordinary_run))
            ordinary_run = []
            if not skip_special_tokens:
                parts.append(special)
        parts.append(self._decode_ordinary(ordinary_run))
        return "".join(parts)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None
                        ) -> tuple[str, ...]:
        """Write the library's model file, byte for byte as loaded (so the fingerprint holds)."""
        name = (f"{filename_prefix}-" if filename_prefix else "") + self.vocab_files_names[
            "model_file"]
        path = os.path.join(save_directory, name)
        with open(path, "wb") as handle:
            handle.write(self._model_bytes)
        return (path,)
