"""One document's verdict, computed in a worker process: the rules it fails, whether it
leaks an eval item, and (if it survives) its exact-dedup key and its LSH band keys.

Dedup itself is global (a copy in file B of a document in file A), so workers only compute
each document's keys; clean_pretrain_data.py compares them across the whole corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from data_preprocess.cleaning import minhash
from data_preprocess.cleaning.decontaminate import EvalIndex
from data_preprocess.cleaning.dedup import exact_key
from data_preprocess.cleaning.filters import FilterOptions, first_failure
from data_preprocess.cleaning.text import normal_words, normalise_unicode


@dataclass(frozen=True)
class CleanSettings:
    """Everything a worker needs, sent to each worker process once when it starts."""

    filter_groups: tuple[str, ...]
    filter_options: FilterOptions
    unicode_form: str
    dedup: tuple[str, ...]  # "exact", "minhash"
    num_perm: int
    bands: int
    rows: int
    shingle_words: int
    seed: int
    eval_index: EvalIndex | None


@dataclass(frozen=True)
class Verdict:
    number: int  # the record's line/record number in its file
    bytes_in: int
    drop: tuple[str, Any] | None  # (rule, measured value) or None: survives the filters
    exact_key: str | None
    band_keys: np.ndarray | None


_STATE: dict[str, Any] = {}  # this process's settings and hash permutations (init_worker)


def init_worker(settings: CleanSettings) -> None:
    """Runs once per worker: keep the settings, draw the MinHash permutations once."""
    _STATE.update(settings=settings,
                  perms=minhash.Permutations.make(settings.num_perm, settings.seed))


def verdict(number: int, raw_text: str) -> tuple[Verdict, list[str] | None]:
    """The document's verdict without its band keys, and its words if MinHash must sign it
    (`analyse_batch` signs a whole batch's survivors at once)."""
    settings: CleanSettings = _STATE["settings"]
    text = normalise_unicode(raw_text, settings.unicode_form)
    size = len(raw_text.encode("utf-8"))
    if not text.strip():
        return Verdict(number, size, ("empty", 0), None, None), None
    if failure := first_failure(text, list(settings.filter_groups), settings.filter_options):
        return Verdict(number, size, failure, None, None), None
    words = normal_words(text)
    if settings.eval_index and (gram := settings.eval_index.first_match(words)):
        return Verdict(number, size, ("eval_contamination", gram), None, None), None
    exact = exact_key(words) if "exact" in settings.dedup else None
    return Verdict(number, size, None, exact, None), words if "minhash" in settings.dedup else None


def analyse_batch(batch: list[tuple[int, str]]) -> list[Verdict]:
    """In a worker: (record number, text) pairs -> their verdicts, in the same order. The
    survivors' MinHash signatures are taken together (minhash.document_signatures: one
    block of many documents' shingles, numpy's per-call cost paid once per block)."""
    settings: CleanSettings = _STATE["settings"]
    pairs = [verdict(number, text) for number, text in batch]
    signed = [i for i, (_, words) in enumerate(pairs) if words is not None]
    signatures = minhash.document_signatures([pairs[i][1] for i in signed],
                                             settings.shingle_words, _STATE["perms"])
    verdicts = [each for each, _ in pairs]
    for i, sig in zip(signed, signatures):
        verdicts[i] = replace(verdicts[i], band_keys=minhash.band_keys(sig, settings.bands,
                                                                       settings.rows))
    return verdicts
