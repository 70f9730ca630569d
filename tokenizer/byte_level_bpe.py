"""Training the byte-level BPE behind Z2allBpeTokenizer with HF `tokenizers`.

Pipeline of the raw model, in order:
1. no normalizer: the text is taken as it is (exact round trip);
2. pre-tokenization: PRE_TOKENIZE_PATTERN cuts text into chunks, BPE merges never cross a chunk
   border; then every UTF-8 byte is mapped to one printable character (GPT-2's byte alphabet);
3. BPE over those byte characters, starting from all 256 bytes, so nothing is ever unknown;
4. decoding maps the characters back to bytes, then to UTF-8.

Worked example, "我爱Python 2024!" is cut into  我爱 | Python | " " | 202 | 4 | !
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from tokenizer.long_texts import bounded_pieces

# The trainer splits each training text into words in memory at once: longer documents are fed
# in pieces of at most this many bytes (tokenizer/long_texts.py).
MAX_TRAINING_PIECE_BYTES = 1 << 20

CJK = r"\p{Han}\p{Hiragana}\p{Katakana}"
# Alternatives in order (the first that matches at a position wins); it extends GPT-4's
# cl100k pattern (public in tiktoken) in two places, marked *:
PRE_TOKENIZE_PATTERN = "|".join([
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)",       # English contractions stay one chunk
    rf"[{CJK}]+",                            # * a run of Chinese/Japanese characters on its own:
                                             #   CJK is not space-separated, so without this a
                                             #   Chinese phrase would glue onto Latin words
    rf"[^\r\n\p{{L}}\p{{M}}\p{{N}}]?[[\p{{L}}\p{{M}}]&&[^{CJK}]]+",
                                             # a word (letters with their *combining marks, so
                                             #   "é" as e + U+0301 is not cut), with one leading
                                             #   space or punctuation mark
    r"\p{N}{1,3}",                           # numbers in groups of at most 3 digits, see below
    r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*",       # punctuation / operators, e.g. "):" or " **"
    r"\s*[\r\n]+",                           # newlines (with the indentation before them)
    r"\s+(?!\S)",                            # spaces, leaving the last one to the next word
    r"\s+",
])
# Why digit groups of <= 3: one token per digit (LLaMA) makes numbers long; free merging makes
# the split depend on corpus frequency ("2023" one token, "2024" three), which hurts arithmetic.
# Groups of three cost ~n/3 tokens and all 1,110 groups fit in a vocabulary, so every number is
# cut the same way, left to right (as in GPT-4).


def untrained_tokenizer() -> Tokenizer:
    """The raw pipeline above with an empty BPE model."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZE_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train_byte_level_bpe(texts: Iterable[str], base_vocab_size: int, show_progress: bool = True
                         ) -> Tokenizer:
    """Learn merges until the vocabulary holds `base_vocab_size` pieces (256 bytes included).

    `texts` is consumed once, as a stream: the trainer keeps only word counts, not the texts.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if base_vocab_size <= len(alphabet):
        raise ValueError(f"base vocabulary {base_vocab_size} must exceed the {len(alphabet)} bytes")
    trainer = trainers.BpeTrainer(vocab_size=base_vocab_size, initial_alphabet=alphabet,
                                  special_tokens=[], show_progress=show_progress)
    tokenizer = untrained_tokenizer()
    tokenizer.train_from_iterator(bounded_pieces(texts, MAX_TRAINING_PIECE_BYTES),
                                  trainer=trainer)
    return tokenizer
