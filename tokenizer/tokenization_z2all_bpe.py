"""z2all's byte-level BPE tokenizer: HF `tokenizers` underneath, loadable with AutoTokenizer.

The raw model (`byte_level_bpe.json`, trained by tokenizer/byte_level_bpe.py) works on UTF-8
bytes, with all 256 bytes in its vocabulary: no text is ever unknown, and decoding the bytes back
gives the exact input. It holds no added tokens; the specials are managed by the base class.
"""

from __future__ import annotations

import tokenizers

from .tokenization_z2all_base import Z2allTokenizerBase


class Z2allBpeTokenizer(Z2allTokenizerBase):
    kind = "byte_level_bpe"
    vocab_files_names = {"model_file": "byte_level_bpe.json"}

    def _load_model(self, model_bytes: bytes) -> None:
        self._tokenizer = tokenizers.Tokenizer.from_str(model_bytes.decode("utf-8"))
        if self._tokenizer.get_added_tokens_decoder():
            # The library matches added tokens inside text: exactly the injection we forbid.
            raise ValueError("byte_level_bpe.json must not contain added tokens")

    def _base_pieces(self) -> list[str]:
        vocab = self._tokenizer.get_vocab(with_added_tokens=False)
        pieces = sorted(vocab, key=vocab.__getitem__)
        if [vocab[piece] for piece in pieces] != list(range(len(pieces))):
            raise ValueError("byte_level_bpe.json: vocabulary ids are not 0..N-1")
        return pieces

    def _encode_ordinary_batch(self, texts: list[str]) -> list[list[int]]:
        # encode_batch_fast: like encode_batch but skips computing character offsets.
        encodings = self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def _decode_ordinary(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)
