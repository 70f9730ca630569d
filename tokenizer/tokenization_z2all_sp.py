"""z2all's sentencepiece BPE tokenizer, loadable with AutoTokenizer.

The raw model (`sentencepiece.model`, trained by tokenizer/sentencepiece_bpe.py) has
`byte_fallback`: a character outside its pieces becomes its UTF-8 bytes (<0xE4><0xBD><0xA0>),
so nothing is unknown, and identity normalization, so nothing is rewritten.

U+2581 "▁": sentencepiece writes spaces as this symbol inside its pieces, so a literal "▁" in
the text would come back as a space. We keep it exact: text containing "▁" is encoded around
it, and each literal "▁" is written as its three byte pieces <0xE2><0x96><0x81>, which decode to
"▁" itself (byte pieces are never turned into spaces). Such texts may thus get different ids than
the raw library gives; every other text gets exactly the library's ids.
"""

from __future__ import annotations

import sentencepiece

from .tokenization_z2all_base import Z2allTokenizerBase

META_SYMBOL = "\u2581"


class Z2allSentencePieceTokenizer(Z2allTokenizerBase):
    kind = "sentencepiece_bpe"
    vocab_files_names = {"model_file": "sentencepiece.model"}

    def _load_model(self, model_bytes: bytes) -> None:
        self._sp = sentencepiece.SentencePieceProcessor(model_proto=model_bytes)
        if self._sp.bos_id() != -1 or self._sp.eos_id() != -1:
            raise ValueError("sentencepiece.model must have no BOS/EOS: z2all manages specials")
        byte_pieces = [f"<0x{byte:02X}>" for byte in META_SYMBOL.encode("utf-8")]
        self._meta_symbol_ids = [self._sp.piece_to_id(piece) for piece in byte_pieces]
        if not all(self._sp.is_byte(index) for index in self._meta_symbol_ids):
            raise ValueError("sentencepiece.model was trained without byte_fallback")

    def _base_pieces(self) -> list[str]:
        return [self._sp.id_to_piece(index) for index in range(self._sp.get_piece_size())]

    def _encode_ordinary_batch(self, texts: list[str]) -> list[list[int]]:
        all_ids = self._sp.encode(texts)
        for position, text in enumerate(texts):
            if META_SYMBOL in text:
                all_ids[position] = self._encode_keeping_meta_symbol(text)
        return all_ids

    def _encode_keeping_meta_symbol(self, text: str) -> list[int]:
        first, *rest = text.split(META_SYMBOL)
        ids = self._sp.encode(first)
        for part in rest:
            ids += self._meta_symbol_ids + self._sp.encode(part)
        return ids

    def _decode_ordinary(self, ids: list[int]) -> str:
        return self._sp.decode(ids)
