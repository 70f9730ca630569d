"""no byte fallback: a character that is no piece becomes <unk>.

A character the vocabulary lacks (rare scripts, emoji) must become its UTF-8 byte pieces
<0xE4><0xBD><0xA0>, as sentencepiece does; otherwise the text is lost and the ids differ from
sentencepiece's on the "rare scripts (bytes)" text.
"""

from __future__ import annotations

import sentencepiece
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

META_SYMBOL = "\u2581"


def sentencepiece_to_tokenizers(model_bytes: bytes) -> Tokenizer:
    """The serialized sentencepiece BPE model as an HF `tokenizers` model with the same ids."""
    processor = sentencepiece.SentencePieceProcessor(model_proto=model_bytes)
    pieces = [processor.id_to_piece(index) for index in range(processor.get_piece_size())]
    mergeable = {piece for index, piece in enumerate(pieces)  # not <unk>, not the byte pieces
                 if not (processor.is_byte(index) or processor.is_unknown(index)
                         or processor.is_control(index))}
    # Every way to build a piece from two pieces, ranked by the built piece's score (best first).
    ranked = []
    for index, piece in enumerate(pieces):
        if piece in mergeable:
            ranked += [(-processor.get_score(index), index, cut, (piece[:cut], piece[cut:]))
                       for cut in range(1, len(piece))
                       if piece[:cut] in mergeable and piece[cut:] in mergeable]
    merges = [pair for *_, pair in sorted(ranked)]
    tokenizer = Tokenizer(models.BPE(
        vocab={piece: index for index, piece in enumerate(pieces)}, merges=merges,
        unk_token=pieces[processor.unk_id()], byte_fallback=False, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=META_SYMBOL,
                                                       prepend_scheme="never", split=False)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(META_SYMBOL, " "),
                                           decoders.ByteFallback(), decoders.Fuse()])
    return tokenizer
