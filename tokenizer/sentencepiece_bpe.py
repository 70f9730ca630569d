"""Training a sentencepiece BPE, and converting it to a `tokenizers` model with the same ids.

Every trainer setting below is chosen so that encode -> decode gives back the exact text, and so
that no text can produce a special token (z2all adds its specials after the base vocabulary).

Why convert: every HF client reads `tokenizer.json`, so z2all saves both kinds in that one format
(tokenizer/z2all_tokenizer.py). sentencepiece's BPE encoding is: write spaces as "▁" (U+2581),
split the text into characters, then repeatedly merge the adjacent pair whose concatenation is
the highest-scoring piece; a character that is no piece becomes its UTF-8 byte pieces
(<0xE4><0xBD><0xA0>). `tokenizers`' BPE does the same given merges ranked by that score, a
Metaspace pre-tokenizer that only replaces spaces (no split, no prefix) and byte_fallback.
The one difference: a literal "▁" in the text reads as a space, so it decodes to " "
(docs/design.md §2.2 allows this one exception); tests/tokenizer/test_z2all_tokenizer.py
checks the ids against sentencepiece's.
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Iterable, Iterator

import sentencepiece
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from tokenizer.long_texts import bounded_pieces

META_SYMBOL = "\u2581"  # how sentencepiece writes a space inside its pieces
# sentencepiece skips training sentences longer than `max_sentence_length` bytes, so longer
# documents are cut (at line ends where possible) into sentences of at most this many bytes.
MAX_SENTENCE_BYTES = 16384


def sentencepiece_settings(base_vocab_size: int, max_sentences: int, show_progress: bool) -> dict:
    return dict(
        model_type="bpe",
        vocab_size=base_vocab_size,          # base vocabulary: <unk> + 256 bytes + merges
        byte_fallback=True,                  # unseen characters -> their UTF-8 bytes, never <unk>
        character_coverage=0.9995,           # the rarest 0.05% of characters are left to bytes
        normalization_rule_name="identity",  # no NFKC: "ｆｕｌｌ" stays full-width
        add_dummy_prefix=False,              # no space invented before the text
        remove_extra_whitespaces=False,      # "a  b\n" keeps both spaces and the newline
        allow_whitespace_only_pieces=True,   # "    " (code indentation) can be one piece
        split_digits=True,                   # numbers one digit per piece, as in LLaMA
        # No BOS/EOS/pad and no user-defined or control symbols: user-defined symbols are matched
        # inside text (injection), and z2all puts its specials after the base vocabulary.
        # <unk> must exist in sentencepiece; with byte_fallback it is never produced.
        unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
        max_sentence_length=MAX_SENTENCE_BYTES,
        # Memory bound: sentencepiece keeps its training sentences in RAM. The stream is read to
        # the end and a uniform random sample (reservoir) of this many sentences is kept.
        input_sentence_size=max_sentences, shuffle_input_sentence=True,
        num_threads=os.cpu_count() or 1,
        # Its INFO log is hundreds of lines on stderr (every setting, then every merge step);
        # warnings and errors stay, and `train_sentencepiece_bpe` says what happened in one line.
        minloglevel=1 if show_progress else 2,
    )


def train_sentencepiece_bpe(texts: Iterable[str], base_vocab_size: int, seed: int = 0,
                            max_sentences: int = 2_000_000, show_progress: bool = True) -> bytes:
    """Train on the stream `texts` (consumed once); returns the serialized model. With
    `show_progress`, one line on stderr says what was trained on and how long it took."""
    sentencepiece.set_random_generator_seed(seed)  # the reservoir sample of sentences
    model = io.BytesIO()
    sentences = 0

    def counted(pieces: Iterable[str]) -> Iterator[str]:
        nonlocal sentences
        for piece in pieces:
            sentences += 1
            yield piece

    started = time.perf_counter()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=counted(bounded_pieces(texts, MAX_SENTENCE_BYTES)), model_writer=model,
        **sentencepiece_settings(base_vocab_size, max_sentences, show_progress))
    if show_progress:
        print(f"sentencepiece: {base_vocab_size} base pieces from {sentences:,} sentences "
              f"(a sample of at most {max_sentences:,} kept) in "
              f"{time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return model.getvalue()


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
        unk_token=pieces[processor.unk_id()], byte_fallback=True, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=META_SYMBOL,
                                                       prepend_scheme="never", split=False)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(META_SYMBOL, " "),
                                           decoders.ByteFallback(), decoders.Fuse()])
    return tokenizer
