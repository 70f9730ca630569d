"""One document as the filter rules see it: cut into words, lines and paragraphs once, each
unit only when a rule first asks for it, and shared by every rule after that.

Why this file exists: 17 rules look at the same words. Asked separately, they split the text
17 times and, worse, the repetition rules build a tuple or a joined string for every n-gram
at every position for n = 2..10 (the old `duplicate_ngrams` alone cost 6.6 s per 1,000
documents). Here the words are numbered once, and every n-gram gets an exact integer id
by numbering pairs (the (n-1)-gram's id, the next word's id) with `np.unique`:

    words      the cat sat the cat sat on
    word ids   0   1   2   0   1   2   3
    2-gram ids (0,1) (1,2) (2,0) (0,1) (1,2) (2,3)  ->  0 2 3 0 2 4   ("the cat" = 0 twice)
    3-gram ids (0,2) (2,3) (3,0) (0,2) (2,4)  ...       (a 2-gram id paired with a word id)

Ids are exact (no hash collisions), so a rule computed on them decides exactly as the
string version did. Per-word tests (has a letter? only symbols?) run once per *distinct*
word, then spread to every occurrence with the ids: prose repeats its words a lot.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from data_preprocess.cleaning.text import is_symbol_only, split_lines, split_paragraphs, split_words


@dataclass(frozen=True)
class NgramIndex:
    """The word n-grams of a document, one per start position i (words i .. i+n-1):
    `ids[i]` the n-gram's number (equal ids: equal n-grams), `first[i]` the position where
    that n-gram first occurs (so `first[i] < i` marks a repeat), `counts[id]` how often it
    occurs."""

    ids: np.ndarray
    first: np.ndarray
    counts: np.ndarray


def number_pairs(left: np.ndarray, right: np.ndarray, right_kinds: int) -> NgramIndex:
    """Number the distinct (left[i], right[i]) pairs: one integer key per pair (exact: both
    are dense ids, so left * right_kinds + right is unique), then `np.unique`."""
    keys = left * right_kinds + right
    _, first_of_id, ids, counts = np.unique(keys, return_index=True, return_inverse=True,
                                            return_counts=True)
    ids = ids.reshape(-1)  # numpy 2.0.x returned the inverse in the input's shape, 2.1 flat
    return NgramIndex(ids, first_of_id[ids], counts)


def repeated(items: list[str]) -> tuple[int, int]:
    """(how many items repeat an earlier one, how many characters those repeats hold)."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count, chars = count + 1, chars + len(item)
        seen.add(item)
    return count, chars


class Document:
    """One text and its units, each cut once and only when a rule first asks for it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._ngrams: dict[int, NgramIndex] = {}

    @functools.cached_property
    def words(self) -> list[str]:
        return split_words(self.text)

    @functools.cached_property
    def vocabulary(self) -> list[str]:
        """The distinct words, in order of first use; `word_ids[i]` indexes this list."""
        return list(dict.fromkeys(self.words))

    @functools.cached_property
    def word_ids(self) -> np.ndarray:
        number = {word: i for i, word in enumerate(self.vocabulary)}
        return np.fromiter(map(number.__getitem__, self.words), dtype=np.int64,
                           count=len(self.words))

    def per_word(self, test: Callable[[str], int]) -> np.ndarray:
        """test(word) for every word, in text order, calling it once per distinct word."""
        return np.array([test(word) for word in self.vocabulary], dtype=np.int64)[self.word_ids]

    @functools.cached_property
    def word_lengths(self) -> np.ndarray:
        return self.per_word(len)

    @functools.cached_property
    def content_mask(self) -> np.ndarray:
        """Which words hold a letter or digit (the rest are punctuation, '#', '...')."""
        return self.per_word(is_symbol_only) == 0

    @functools.cached_property
    def length_prefix(self) -> np.ndarray:
        """length_prefix[i] = characters in words 0 .. i-1, so words i .. j-1 hold
        length_prefix[j] - length_prefix[i] characters."""
        return np.concatenate(([0], np.cumsum(self.word_lengths)))

    def ngrams(self, n: int) -> NgramIndex:
        """The n-gram index, built from the (n-1)-gram one (see the module docstring); kept,
        since the rules ask for n = 2..10 in turn. Once no (n-1)-gram repeats, no longer
        n-gram can: every one is new, and no sort is needed (most prose stops repeating by
        n = 6 or 7)."""
        if n not in self._ngrams:
            count = max(len(self.words) - n + 1, 0)
            shorter = self.ngrams(n - 1) if n > 1 else None
            if shorter is not None and len(shorter.counts) == len(shorter.ids):
                every_one_new = np.arange(count)
                self._ngrams[n] = NgramIndex(every_one_new, every_one_new,
                                             np.ones(count, dtype=np.int64))
            else:
                left = shorter.ids[:count] if shorter else np.zeros(count, dtype=np.int64)
                self._ngrams[n] = number_pairs(left, self.word_ids[n - 1:],
                                               max(len(self.vocabulary), 1))
        return self._ngrams[n]

    @functools.cached_property
    def lines(self) -> list[str]:
        return split_lines(self.text)

    @functools.cached_property
    def paragraphs(self) -> list[str]:
        return split_paragraphs(self.text)

    @functools.cached_property
    def repeated_lines(self) -> tuple[int, int]:
        return repeated(self.lines)

    @functools.cached_property
    def repeated_paragraphs(self) -> tuple[int, int]:
        return repeated(self.paragraphs)

    @functools.cached_property
    def physical_lines(self) -> list[str]:
        """str.splitlines (every break a line, blank ones too), as the bullet rules count."""
        return self.text.splitlines() or [""]
