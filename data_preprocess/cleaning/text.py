"""How the cleaning rules see a document: normalised Unicode, words, lines and paragraphs.

Every rule measures the same units, so they are cut here, once:
    words       the text split at whitespace, punctuation attached: "Hi, you ... #tag" ->
                [Hi, | you | ... | #tag]. Gopher's rules are about words as a reader sees
                them; a tokenizer that makes every comma a word (spaCy, NLTK) would call
                punctuation-rich prose such as verse "not words" (see filters.py)
    lines       the text split at newlines (runs of newlines count as one break)
    paragraphs  the stripped text split at blank lines (two or more newlines)
`normal_words` is the lower-cased word list without punctuation that dedup and
decontamination compare, so "The KING!" and "the king" look the same to them.
"""

from __future__ import annotations

import re
import unicodedata

NORMAL_WORD = re.compile(r"\w+(?:['’]\w+)*")  # letters/digits, inner apostrophes: "don't"
LINE_BREAKS = re.compile(r"\n+")
PARAGRAPH_BREAKS = re.compile(r"\n{2,}")
ASCII_ALNUM = re.compile("[A-Za-z0-9]").search  # = str.isalnum on ASCII characters
ASCII_LETTER = re.compile("[A-Za-z]").search  # = str.isalpha on ASCII characters
UNICODE_FORMS = ("NFC", "NFKC", "none")


def normalise_unicode(text: str, form: str = "NFC") -> str:
    """One byte sequence per visible text: "é" typed as one code point or as e + accent are
    different bytes (so different tokens, and missed duplicates) until normalised. NFC only
    composes; NFKC also folds compatibility forms (ﬁ -> fi, full-width letters -> ASCII)."""
    return text if form == "none" else unicodedata.normalize(form, text)


def split_words(text: str) -> list[str]:
    """Whitespace-separated words, in text order."""
    return text.split()


def is_symbol_only(word: str) -> bool:
    """A token without a single letter or digit: punctuation, "#", "...", "—". For ASCII
    (most words) one regex search in C says the same as the per-character test, 5x faster."""
    if word.isascii():
        return ASCII_ALNUM(word) is None
    return not any(char.isalnum() for char in word)


def has_letter(word: str) -> bool:
    """Whether a word holds a letter (digits do not count): "x86" yes, "1999" and "--" no."""
    if word.isascii():
        return ASCII_LETTER(word) is not None
    return any(char.isalpha() for char in word)


def split_lines(text: str) -> list[str]:
    return LINE_BREAKS.split(text)


def split_paragraphs(text: str) -> list[str]:
    return PARAGRAPH_BREAKS.split(text.strip())


def normal_words(text: str) -> list[str]:
    """Lower-cased words without punctuation tokens: what duplicates and leaks are matched on."""
    return NORMAL_WORD.findall(text.lower())
