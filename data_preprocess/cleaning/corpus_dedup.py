"""Pass 2 of clean_pretrain_data: which surviving documents the whole corpus drops as exact and
near duplicates, in one process or as stages that hand over through files in CLEAN/.clean/.

Documents that pass the filters are numbered 0, 1, 2, ... in source order (files sorted,
records in file order); row i of a file's `<file>.bands.npy` is its i-th survivor.

In one process (`duplicate_drops` with no `staged_pairs`): exact copies, then for each band
the candidate pairs of that band's buckets (cleaning/dedup.py), joined into clusters.

As stages (docs/design.md §2.13), each a separate command:
- *buckets*, an array: task I of N takes the bands b with b % N == I; for each it writes the
  band's candidate pairs, (first member of the bucket, member), to `buckets/band-BBBB.pairs`
  (raw little-endian int64 pairs) and then `buckets/band-BBBB.json`, the commit mark that names
  the run (a hash of the settings and every input's size and mtime) and the pair count.
  A band is one task's alone, so tasks never write the same file, and a rerun of a task
  redoes only its bands that are not done.
- *clusters*, once: exact copies, then union-find over every band's pairs; it writes
  `duplicates.json`, the documents dropped as duplicates per file, which the write tasks and
  the merge read.
The buckets leave exact copies in (a task would have to read every file's verdicts to know
them); the clusters step drops the pairs whose member is an exact copy. That is the single
run's answer, where the copies are skipped before the sort: an exact copy has the same words
as its first, hence the same band keys, so its first sits in every bucket it sits in, with a
smaller number; the copy is never a bucket's first, and without its pairs every bucket joins
the same documents to the same first.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from data_preprocess.cleaning import dedup, external_sort
from utils.atomic_io import atomic_open, atomic_write_json

BUCKETS_DIR = "buckets"
DUPLICATES_FILE = "duplicates.json"
PAIR = np.dtype("<i8")  # a pair file is (first member, member) int64 pairs, nothing else
PAIRS_PER_READ = 65536

Drops = dict[int, tuple[str, Any]]  # record number in its file -> (rule, value)


@dataclass
class Survivors:
    """The numbering of every document that passed the filters, and what dedup reads of it."""

    where: list[tuple[int, int]]  # survivor number -> (file index, record number)
    exact_keys: list[tuple[int, str]]  # (survivor number, exact key), in order
    band_files: list[dedup.BandFile]  # per input file, its rows' survivor numbers

    def name(self, survivor: int, names: Sequence[str]) -> str:
        """`<file>:<record number>`: how the report and the dropped files name a document."""
        file_index, number = self.where[survivor]
        return f"{names[file_index]}:{number}"


def filter_drops(analysis: dict[str, Any]) -> Drops:
    """The documents of one file that a filter (or decontamination) dropped."""
    return {number: (rule, value) for number, _, rule, value, _ in analysis["verdicts"]
            if rule is not None}


def number_survivors(analyses: Sequence[dict[str, Any]], band_paths: Sequence[Path]) -> Survivors:
    survivors = Survivors([], [], [])
    for file_index, (analysis, band_path) in enumerate(zip(analyses, band_paths)):
        first_survivor = len(survivors.where)
        for number, _, rule, _, key in analysis["verdicts"]:
            if rule is not None:
                continue
            if key is not None:
                survivors.exact_keys.append((len(survivors.where), key))
            survivors.where.append((file_index, number))
        survivors.band_files.append(dedup.BandFile(band_path, first_survivor,
                                                   len(survivors.where) - first_survivor))
    return survivors


def duplicate_drops(names: Sequence[str], analyses: Sequence[dict[str, Any]],
                    band_paths: Sequence[Path], dedup_kinds: Sequence[str], bands: int,
                    state_dir: Path, sort_records: int,
                    staged_pairs: Iterable[tuple[int, int]] | None = None) -> list[Drops]:
    """Per file, {record number: (rule, the document it copies)} of every duplicate: exact
    copies first, then near-duplicate clusters among what is left. The candidate pairs come
    from `staged_pairs` (the buckets stage's files) or, when None, are made here, one band at
    a time, sorted externally (`sort_records` at a time, in `state_dir`/sort-*)."""
    survivors = number_survivors(analyses, band_paths)
    drops: list[Drops] = [{} for _ in names]

    def drop(survivor: int, rule: str, first: int) -> None:
        file_index, number = survivors.where[survivor]
        drops[file_index][number] = (rule, survivors.name(first, names))

    copies = dedup.exact_duplicates(survivors.exact_keys)
    for survivor, first in copies.items():
        drop(survivor, "exact_duplicate", first)
    if "minhash" in dedup_kinds:
        if staged_pairs is None:
            if removed := external_sort.remove_leftover_work_dirs(state_dir):
                print(f"removed {removed} sort folder(s) left in {state_dir} by an "
                      "interrupted run")
            near = dedup.near_duplicates(survivors.band_files, bands,
                                         np.array(sorted(copies), dtype=np.int64), state_dir,
                                         sort_records)
        else:  # a copy is never a bucket's first (module docstring): dropping its pairs will do
            near = dedup.first_of_clusters((head, doc) for head, doc in staged_pairs
                                           if doc not in copies)
        for survivor, first in near.items():
            drop(survivor, "near_duplicate", first)
    return drops


def band_stem(state_dir: Path, band: int) -> Path:
    return state_dir / BUCKETS_DIR / f"band-{band:04d}"


def band_done(state_dir: Path, band: int, run: str) -> bool:
    """Whether the band's pairs were written, whole, for this very run."""
    stem = band_stem(state_dir, band)
    try:
        mark = json.loads(stem.with_suffix(".json").read_text())
        size = stem.with_suffix(".pairs").stat().st_size
    except (OSError, ValueError):
        return False
    return isinstance(mark, dict) and mark.get("run") == run and \
        size == mark.get("pairs", -1) * 2 * PAIR.itemsize


def missing_bands(state_dir: Path, bands: int, run: str) -> list[str]:
    """The commit marks (relative to `state_dir`) of the bands not done for this run."""
    return [band_stem(state_dir, band).with_suffix(".json").relative_to(state_dir).as_posix()
            for band in range(bands) if not band_done(state_dir, band, run)]


def write_band_buckets(names: Sequence[str], analyses: Sequence[dict[str, Any]],
                       band_paths: Sequence[Path], bands: int, my_bands: Sequence[int],
                       state_dir: Path, sort_records: int, run: str) -> int:
    """The buckets stage for `my_bands`: each band's candidate pairs over the whole corpus
    (exact copies included), then its commit mark. Returns how many bands were already done."""
    survivors = number_survivors(analyses, band_paths)
    done = 0
    for band in my_bands:
        if band_done(state_dir, band, run):
            done += 1
            continue
        stem = band_stem(state_dir, band)
        stem.with_suffix(".json").unlink(missing_ok=True)  # from here on: not done
        work_dir = stem.with_suffix(".sort")  # this band's alone: a killed task's is removable
        shutil.rmtree(work_dir, ignore_errors=True)
        count = 0
        with atomic_open(stem.with_suffix(".pairs"), "wb") as handle:
            pairs = dedup.band_pairs(survivors.band_files, band, bands, np.empty(0, np.int64),
                                     work_dir, sort_records)
            while chunk := [pair for _, pair in zip(range(PAIRS_PER_READ), pairs)]:
                np.array(chunk, dtype=PAIR).tofile(handle)
                count += len(chunk)
        shutil.rmtree(work_dir, ignore_errors=True)
        atomic_write_json(stem.with_suffix(".json"), {
            "format": "z2all-clean-buckets", "version": 1, "run": run, "band": band,
            "pairs": count, "files": len(names)})
    return done


def read_band_pairs(state_dir: Path, bands: int) -> Iterator[tuple[int, int]]:
    """Every band's candidate pairs, band by band, a block at a time."""
    for band in range(bands):
        with open(band_stem(state_dir, band).with_suffix(".pairs"), "rb") as handle:
            while len(block := np.fromfile(handle, dtype=PAIR, count=2 * PAIRS_PER_READ)):
                yield from zip(block[0::2].tolist(), block[1::2].tolist())


def write_duplicates(state_dir: Path, run: str, names: Sequence[str],
                     drops: Sequence[Drops]) -> None:
    """The clusters stage's hand-over: every file's duplicates, for this run."""
    atomic_write_json(state_dir / DUPLICATES_FILE, {
        "format": "z2all-clean-duplicates", "version": 1, "run": run,
        "drops": {name: [[number, *drop] for number, drop in sorted(file_drops.items())]
                  for name, file_drops in zip(names, drops) if file_drops}}, indent=None)


def load_duplicates(state_dir: Path, run: str, names: Sequence[str]) -> list[Drops] | None:
    """`write_duplicates`'s drops, per file of `names`, or None if it is absent or of
    another run."""
    try:
        record = json.loads((state_dir / DUPLICATES_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("run") != run:
        return None
    by_name = record["drops"]
    return [{number: (rule, value) for number, rule, value in by_name.get(name, [])}
            for name in names]
