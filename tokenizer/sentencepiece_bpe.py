"""Training the sentencepiece BPE behind Z2allSentencePieceTokenizer.

Every trainer setting below is chosen so that encode -> decode gives back the exact text, and so
that no text can produce a special token (z2all adds its specials after the base vocabulary).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator

import sentencepiece

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
        minloglevel=0 if show_progress else 2,  # 0: log each stage and merge progress
    )


def training_sentences(texts: Iterable[str], max_bytes: int = MAX_SENTENCE_BYTES
                       ) -> Iterator[str]:
    """Each text as one sentence, or cut into consecutive sentences of <= max_bytes bytes."""
    max_chars = max_bytes // 4  # a character is at most 4 UTF-8 bytes
    for text in texts:
        if len(text) <= max_chars or len(text.encode("utf-8")) <= max_bytes:
            yield text
            continue
        chunk: list[str] = []
        chunk_bytes = 0
        for line in text.splitlines(keepends=True):
            for start in range(0, len(line), max_chars):
                piece = line[start:start + max_chars]
                piece_bytes = len(piece.encode("utf-8"))
                if chunk and chunk_bytes + piece_bytes > max_bytes:
                    yield "".join(chunk)
                    chunk, chunk_bytes = [], 0
                chunk.append(piece)
                chunk_bytes += piece_bytes
        if chunk:
            yield "".join(chunk)


def train_sentencepiece_bpe(texts: Iterable[str], base_vocab_size: int, seed: int = 0,
                            max_sentences: int = 2_000_000, show_progress: bool = True) -> bytes:
    """Train on the stream `texts` (consumed once); returns the serialized model."""
    sentencepiece.set_random_generator_seed(seed)  # the reservoir sample of sentences
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=training_sentences(texts), model_writer=model,
        **sentencepiece_settings(base_vocab_size, max_sentences, show_progress))
    return model.getvalue()
