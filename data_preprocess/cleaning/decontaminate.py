"""Decontamination: drop training documents that contain an evaluation item, so a benchmark
measures what a model can do rather than what it has read (GPT-3 paper, appendix C).

A document is contaminated if it shares a 13-word n-gram with any item (the GPT-3
convention: 13 words are long enough never to be shared by chance, short enough to catch a
copied question inside a longer page). Words are compared after normal_words (lower case,
no punctuation). An item shorter than 13 words is matched as a whole (all its words in a
row), if it has at least `min_words` (8, as GPT-3's shortest n-gram): shorter ones ("yes",
"Paris") would match innocent text, so they are counted and left out.

Items: every string field of every record of the given .jsonl/.json/.parquet files (or of
every such file under a given folder), nested fields included. A file that gives no item to
match (empty, no string fields, or only items under `min_words`) is refused, naming it: the
run would otherwise say it decontaminated against it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_preprocess.cleaning.text import normal_words
from utils.data_files import find_data_files
from utils.dataset_splits import EVAL_SPLITS
from utils.readers import iter_records

EVAL_EXTENSIONS = (".jsonl", ".json", ".parquet")


@dataclass
class EvalIndex:
    """The n-grams of every evaluation item, and the whole word runs of the short ones."""

    ngram: int = 13
    min_words: int = 8
    grams: set[str] = field(default_factory=set)
    short_items: dict[int, set[str]] = field(default_factory=dict)  # by length in words
    items: int = 0
    too_short: int = 0

    def add(self, text: str) -> None:
        words = normal_words(text)
        self.items += 1
        if len(words) >= self.ngram:
            self.grams.update(" ".join(words[i:i + self.ngram])
                              for i in range(len(words) - self.ngram + 1))
        elif len(words) >= self.min_words:
            self.short_items.setdefault(len(words), set()).add(" ".join(words))
        else:
            self.too_short += 1

    def first_match(self, words: list[str]) -> str | None:
        """The first n-gram (or whole short item) of `words` that an eval item contains."""
        lengths = ([self.ngram] if self.grams else []) + sorted(self.short_items)
        for length in lengths:
            wanted = self.grams if length == self.ngram else self.short_items[length]
            for i in range(len(words) - length + 1):
                if (gram := " ".join(words[i:i + length])) in wanted:
                    return gram
        return None


def string_fields(value: Any) -> Iterator[str]:
    """Every string inside a record, however deeply nested in lists and objects."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from string_fields(item)
    elif isinstance(value, list):
        for item in value:
            yield from string_fields(item)


def build_eval_index(paths: Sequence[str | Path], ngram: int, min_words: int) -> EvalIndex:
    """Read every eval file `paths` name (a bad record stops with its file:line); a `datasets`
    folder or Hub dataset gives its validation split, else its test split."""
    index = EvalIndex(ngram=ngram, min_words=min_words)
    for path in find_data_files(paths, extensions=EVAL_EXTENSIONS, splits=EVAL_SPLITS,
                                option="--decontaminate"):
        items_before, too_short_before, records = index.items, index.too_short, 0
        for record in iter_records(path):
            records += 1
            for text in string_fields(record.data):
                index.add(text)
        items, too_short = index.items - items_before, index.too_short - too_short_before
        if items == too_short:  # nothing of this file could ever match
            raise ValueError(f"--decontaminate: {path} holds nothing to match ("
                             + _why_nothing(records, items, min_words) + ")")
    return index


def _why_nothing(records: int, items: int, min_words: int) -> str:
    if records == 0:
        return "no records: is it the file you meant?"
    if items == 0:
        return (f"{records} records, none with a text field: name the file of the "
                "benchmark's questions and answers")
    return (f"{records} records, all {items} texts shorter than --decontaminate_min_words="
            f"{min_words} words: lower it, or leave the file out")
