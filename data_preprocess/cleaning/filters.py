"""Quality and repetition rules from Gopher (Rae et al. 2021, "Scaling Language Models",
appendix A1.1.2), each a small named function with its thresholds as options.

A rule returns None when the document passes, or the measured value that failed, so the
report can show *why* ("mean_word_length = 2.1"). The rules run in the order listed in
`QUALITY_RULES` and `REPETITION_RULES`; a document is dropped by the first rule it fails.

Words are whitespace-separated (cleaning/text.py); a "content word" has a letter or digit.
Conventions that decide borderline documents (chosen to match the widely used datatrove
implementation of the same rules, so given the same words both keep the same documents;
tests/data_preprocess/cleaning/test_filters.py checks it): ratios per word count *all*
words, punctuation-only ones included; the mean word
length counts content words only; stop words are matched as written (case-sensitive); a
character fraction divides by the length of the whole text.

Worked example (repetition): the text "a b\\na b\\nc" (11 chars) has lines [a b, a b, c]:
one duplicate line of 3 chars -> duplicate_lines = 1/3 (> 0.30: dropped), and
duplicate_line_chars = 3/11 = 0.27 (> 0.20: would be dropped too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

import numpy as np

from data_preprocess.cleaning.document import Document
from data_preprocess.cleaning.text import has_letter
from utils.option_checks import join_problems, option, range_problem

STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")


COUNT = (0, None)  # a number of words: any whole number >= 0
LENGTH = (0, None)  # a mean word length in characters
PER_WORD = (0, None)  # '#' or '...' per word: not a fraction, "### ###" has 3 per word
FRACTION = (0, 1)  # a share of lines, words or characters


def threshold(default: float, valid: tuple[float, float | None], help: str) -> Any:  # noqa: A002
    """A rule's threshold: its default, the range a value must lie in, and its --help line."""
    return field(default=default, metadata={"help": help, "valid": valid})


@dataclass(frozen=True)
class FilterOptions:
    """Thresholds of every rule (Gopher's values are the defaults); each is a CLI option."""

    min_doc_words: int = threshold(50, COUNT, "drop documents with fewer content words")
    max_doc_words: int = threshold(100_000, COUNT, "drop documents with more content words")
    min_mean_word_length: float = threshold(3, LENGTH,
                                            "drop if the mean content-word length is below")
    max_mean_word_length: float = threshold(10, LENGTH,
                                            "drop if the mean content-word length is above")
    max_symbol_word_ratio: float = threshold(0.1, PER_WORD, "max '#' and max '...' per word")
    max_bullet_lines: float = threshold(0.9, FRACTION,
                                        "max fraction of lines starting with a bullet")
    max_ellipsis_lines: float = threshold(0.3, FRACTION,
                                          "max fraction of lines ending in an ellipsis")
    min_alpha_words: float = threshold(0.8, FRACTION, "min fraction of words holding a letter")
    min_stop_words: int = threshold(2, COUNT,
                                    f"min distinct stop words present ({' '.join(STOP_WORDS)})")
    max_duplicate_lines: float = threshold(0.3, FRACTION,
                                           "max fraction of lines that repeat an earlier one")
    max_duplicate_paragraphs: float = threshold(0.3, FRACTION,
                                                "max fraction of repeated paragraphs")
    max_duplicate_line_chars: float = threshold(0.2, FRACTION,
                                                "max fraction of characters in repeated lines")
    max_duplicate_paragraph_chars: float = threshold(0.2, FRACTION,
                                                     "max fraction of chars in repeated paras")
    max_top_2gram_chars: float = threshold(0.2, FRACTION,
                                           "max char fraction of the most frequent 2-gram")
    max_top_3gram_chars: float = threshold(0.18, FRACTION,
                                           "max char fraction of the most frequent 3-gram")
    max_top_4gram_chars: float = threshold(0.16, FRACTION,
                                           "max char fraction of the most frequent 4-gram")
    max_duplicate_ngram_chars: str = option(
        "5:0.15,6:0.14,7:0.13,8:0.12,9:0.11,10:0.10",
        "n:fraction pairs: max char fraction covered by repeated n-grams")


def duplicate_ngram_limits(options: FilterOptions) -> list[tuple[int, float]]:
    """"5:0.15,6:0.14" -> [(5, 0.15), (6, 0.14)]; raises ValueError naming the option on a
    malformed pair, an n below 1 (a 0-gram would never advance the scan) or a fraction
    outside [0, 1] (nan included: it would switch the rule off)."""
    limits = []
    for pair in options.max_duplicate_ngram_chars.split(","):
        n, _, fraction = pair.partition(":")
        try:
            limit = (int(n), float(fraction))
        except ValueError:
            raise ValueError(f"--max_duplicate_ngram_chars: expected n:fraction pairs like "
                             f"5:0.15, got {pair!r}") from None
        problem = join_problems([range_problem(f"--max_duplicate_ngram_chars: n in {pair!r}",
                                               limit[0], 1),
                                 range_problem(f"--max_duplicate_ngram_chars: fraction in "
                                               f"{pair!r}", limit[1], *FRACTION)])
        if problem:
            raise ValueError(problem)
        limits.append(limit)
    return limits


def threshold_problems(options: FilterOptions) -> list[str | None]:
    """Why each threshold is out of its range (None where it is fine), checked before any work:
    a nan compares false with every value and would switch its rule off without a word, and a
    fraction given a count (`--max_bullet_lines 5`) would never drop anything."""
    problems = [range_problem(f"--{f.name}", getattr(options, f.name), *f.metadata["valid"])
                for f in fields(options) if "valid" in f.metadata]
    for low, high in (("min_doc_words", "max_doc_words"),
                      ("min_mean_word_length", "max_mean_word_length")):
        if getattr(options, low) > getattr(options, high):
            problems.append(f"--{low} {getattr(options, low)} is above --{high} "
                            f"{getattr(options, high)}: every document would be dropped")
    try:
        duplicate_ngram_limits(options)
    except ValueError as error:
        problems.append(str(error))
    return problems


Measure = float | int | None  # None: the document passes; a number: the value that failed
Rule = Callable[[Document, FilterOptions], Measure]


# --- Gopher quality: text that is not prose (tables, lists, link farms, code dumps) ---------

def too_few_words(doc: Document, o: FilterOptions) -> Measure:
    """Very short pages are navigation, error pages or stubs, not language to learn from."""
    n = int(doc.content_mask.sum())
    return n if n < o.min_doc_words else None


def too_many_words(doc: Document, o: FilterOptions) -> Measure:
    """Gigantic single documents are mostly logs and dumps, and dominate a batch."""
    n = int(doc.content_mask.sum())
    return n if n > o.max_doc_words else None


def mean_word_length_out_of_range(doc: Document, o: FilterOptions) -> Measure:
    """Mean word length outside 3..10 characters marks gibberish, hashes or run-together text."""
    content = int(doc.content_mask.sum())
    if not content:
        return 0.0
    mean = int(doc.word_lengths[doc.content_mask].sum()) / content
    return mean if not o.min_mean_word_length <= mean <= o.max_mean_word_length else None


def too_many_hashes(doc: Document, o: FilterOptions) -> Measure:
    """More than one '#' per ten words: hashtag spam and markup, not prose."""
    ratio = doc.text.count("#") / max(len(doc.words), 1)
    return ratio if ratio > o.max_symbol_word_ratio else None


def too_many_ellipses(doc: Document, o: FilterOptions) -> Measure:
    """Many '...' mark truncated snippets (search results, teasers), not whole text."""
    ratio = (doc.text.count("...") + doc.text.count("…")) / max(len(doc.words), 1)
    return ratio if ratio > o.max_symbol_word_ratio else None


def mostly_bullet_lines(doc: Document, o: FilterOptions) -> Measure:
    """A page that is >90% bullet lines is a menu or a list of links."""
    lines = doc.physical_lines
    share = sum(line.lstrip().startswith(("•", "-")) for line in lines) / len(lines)
    return share if share > o.max_bullet_lines else None


def mostly_ellipsis_lines(doc: Document, o: FilterOptions) -> Measure:
    """Lines cut off with '...' (>30% of them) are excerpts of text found elsewhere."""
    lines = doc.physical_lines
    share = sum(line.rstrip().endswith(("...", "…")) for line in lines) / len(lines)
    return share if share > o.max_ellipsis_lines else None


def too_few_alpha_words(doc: Document, o: FilterOptions) -> Measure:
    """Under 80% of words with a letter: tables of numbers, code, symbol soup."""
    share = int(doc.per_word(has_letter).sum()) / max(len(doc.words), 1)
    return share if share < o.min_alpha_words else None


def too_few_stop_words(doc: Document, o: FilterOptions) -> Measure:
    """Real English sentences use "the", "of", "and"...: text with <2 of them is not prose."""
    present = len(set(STOP_WORDS).intersection(doc.vocabulary))
    return present if present < o.min_stop_words else None


# --- Gopher repetition: repeated content is boilerplate, and models learn to loop from it ---

def duplicate_paragraphs(doc: Document, o: FilterOptions) -> Measure:
    """Repeated paragraphs (>30%) are templates: headers, footers, cookie notices."""
    share = doc.repeated_paragraphs[0] / len(doc.paragraphs)
    return share if share > o.max_duplicate_paragraphs else None


def duplicate_paragraph_chars(doc: Document, o: FilterOptions) -> Measure:
    """...also by characters, so a few long repeated paragraphs count (>20%)."""
    share = doc.repeated_paragraphs[1] / max(len(doc.text), 1)
    return share if share > o.max_duplicate_paragraph_chars else None


def duplicate_lines(doc: Document, o: FilterOptions) -> Measure:
    """Repeated lines (>30%): menus, timestamps, "Reply" buttons."""
    share = doc.repeated_lines[0] / len(doc.lines)
    return share if share > o.max_duplicate_lines else None


def duplicate_line_chars(doc: Document, o: FilterOptions) -> Measure:
    """...and the characters in them (>20%)."""
    share = doc.repeated_lines[1] / max(len(doc.text), 1)
    return share if share > o.max_duplicate_line_chars else None


def top_ngram_chars(doc: Document, n: int) -> float:
    """Characters of the most frequent word n-gram times its count, over the text's length
    (ties: the n-gram seen first). "ha ha ha ha" has top 2-gram "ha ha" x3 -> 15/11."""
    index = doc.ngrams(n)
    if not len(index.ids):
        return 0.0
    top = int(index.counts.max())
    at = int(np.argmax(index.counts[index.ids] == top))  # first position of a top n-gram
    chars = int(doc.length_prefix[at + n] - doc.length_prefix[at]) + n - 1  # + the spaces
    return chars * top / max(len(doc.text), 1)


def make_top_ngram_rule(n: int, field_name: str) -> Rule:
    def top_ngram(doc: Document, o: FilterOptions) -> Measure:
        share = top_ngram_chars(doc, n)
        return share if share > getattr(o, field_name) else None
    top_ngram.__name__ = f"top_{n}gram_chars"
    top_ngram.__doc__ = f"One {n}-gram dominating the text (spam, SEO phrases)."
    return top_ngram


def duplicate_ngram_chars(doc: Document, n: int) -> float:
    """Share of the text's characters (words only, no spaces) in n-grams that repeat an
    earlier n-gram; after a repeat the scan jumps past it so overlapping repeats count once.

    The scan visits positions 0, 1, 2, ... and remembers the n-grams it visited; a jump
    skips n - 1 positions, whose n-grams it never remembers. Only repeats (positions whose
    n-gram occurred before, `first[i] < i`) can be counted or cause a jump, so the loop walks
    those alone: a repeat at i counts if its first occurrence was visited (not skipped) or
    if a visited repeat already had the same n-gram."""
    index = doc.ngrams(n)
    positions = len(index.ids)
    repeats = np.flatnonzero(index.first < np.arange(positions))
    skipped = np.zeros(positions + n, dtype=bool)
    visited_repeats: set[int] = set()  # n-gram ids seen at a visited repeat
    chars, resume = 0, 0
    for i, gram, first in zip(repeats.tolist(), index.ids[repeats].tolist(),
                              index.first[repeats].tolist()):
        if i < resume:  # inside the last counted repeat: skipped
            continue
        if not skipped[first] or gram in visited_repeats:
            chars += int(doc.length_prefix[i + n] - doc.length_prefix[i])
            skipped[i + 1:i + n] = True
            resume = i + n
        else:
            visited_repeats.add(gram)
            resume = i + 1
    return chars / max(len(doc.text), 1)


def duplicate_ngrams(doc: Document, o: FilterOptions) -> Measure:
    """Long n-grams (5..10 words) repeated across the text: copy-pasted blocks, loops."""
    for n, limit in duplicate_ngram_limits(o):
        share = duplicate_ngram_chars(doc, n)
        if share > limit:
            return share
    return None


QUALITY_RULES: tuple[Rule, ...] = (
    too_few_words, too_many_words, mean_word_length_out_of_range, too_many_hashes,
    too_many_ellipses, mostly_bullet_lines, mostly_ellipsis_lines, too_few_alpha_words,
    too_few_stop_words)
REPETITION_RULES: tuple[Rule, ...] = (
    duplicate_paragraphs, duplicate_paragraph_chars, duplicate_lines, duplicate_line_chars,
    make_top_ngram_rule(2, "max_top_2gram_chars"), make_top_ngram_rule(3, "max_top_3gram_chars"),
    make_top_ngram_rule(4, "max_top_4gram_chars"), duplicate_ngrams)
RULE_GROUPS = {"gopher_quality": QUALITY_RULES, "gopher_repetition": REPETITION_RULES}

# Each rule's name in datatrove (the reason its GopherQualityFilter / GopherRepetitionFilter
# gives), so a report reads beside theirs, and its threshold as a report shows it.
RULE_DETAILS: dict[str, tuple[str, str]] = {
    "too_few_words": ("gopher_short_doc", "< {min_doc_words} (--min_doc_words)"),
    "too_many_words": ("gopher_long_doc", "> {max_doc_words} (--max_doc_words)"),
    "mean_word_length_out_of_range": (
        "gopher_below_avg_threshold / gopher_above_avg_threshold",
        "outside [{min_mean_word_length}, {max_mean_word_length}] "
        "(--min_mean_word_length, --max_mean_word_length)"),
    "too_many_hashes": ("gopher_too_many_hashes", "> {max_symbol_word_ratio} "
                                                  "(--max_symbol_word_ratio)"),
    "too_many_ellipses": ("gopher_too_many_ellipsis", "> {max_symbol_word_ratio} "
                                                      "(--max_symbol_word_ratio)"),
    "mostly_bullet_lines": ("gopher_too_many_bullets", "> {max_bullet_lines} "
                                                       "(--max_bullet_lines)"),
    "mostly_ellipsis_lines": ("gopher_too_many_end_ellipsis", "> {max_ellipsis_lines} "
                                                              "(--max_ellipsis_lines)"),
    "too_few_alpha_words": ("gopher_below_alpha_threshold", "< {min_alpha_words} "
                                                            "(--min_alpha_words)"),
    "too_few_stop_words": ("gopher_enough_stop_words", "< {min_stop_words} (--min_stop_words)"),
    "duplicate_paragraphs": ("dup_para_frac", "> {max_duplicate_paragraphs} "
                                              "(--max_duplicate_paragraphs)"),
    "duplicate_paragraph_chars": ("dup_para_char_frac", "> {max_duplicate_paragraph_chars} "
                                                        "(--max_duplicate_paragraph_chars)"),
    "duplicate_lines": ("dup_line_frac", "> {max_duplicate_lines} (--max_duplicate_lines)"),
    "duplicate_line_chars": ("dup_line_char_frac", "> {max_duplicate_line_chars} "
                                                   "(--max_duplicate_line_chars)"),
    **{f"top_{n}gram_chars": (f"top_{n}_gram", f"> {{max_top_{n}gram_chars}} "
                                               f"(--max_top_{n}gram_chars)") for n in (2, 3, 4)},
    "duplicate_ngrams": ("duplicated_<n>_n_grams", "> n:fraction {max_duplicate_ngram_chars} "
                                                   "(--max_duplicate_ngram_chars)"),
}


def rule_details(options: FilterOptions) -> dict[str, dict[str, str]]:
    """{rule: {"datatrove": their name, "threshold": "> 0.9 (--max_bullet_lines)"}}."""
    values = {f.name: getattr(options, f.name) for f in fields(options)}
    return {rule: {"datatrove": theirs, "threshold": template.format(**values)}
            for rule, (theirs, template) in RULE_DETAILS.items()}


def first_failure(text: str, groups: list[str], options: FilterOptions) -> tuple[str, float] | None:
    """(rule name, measured value) of the first rule the text fails, or None if it passes."""
    doc = Document(text)
    for group in groups:
        for rule in RULE_GROUPS[group]:
            value = rule(doc, options)
            if value is not None:
                return rule.__name__, round(float(value), 4)
    return None


def option_fields() -> list[tuple[str, type, object, str]]:
    """(name, type, default, help) of every threshold, for the command line. The type is the
    declared one, not the default's: `--max_mean_word_length 10.5` is a float though 10 is not."""
    declared = get_type_hints(FilterOptions)
    return [(f.name, declared[f.name], f.default, f.metadata["help"])
            for f in fields(FilterOptions)]
