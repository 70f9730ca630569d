"""Exact and near-duplicate removal: which documents to drop, and which earlier one each
copies. Documents are numbered 0, 1, 2, ... in source order (files sorted, records in file
order), and of every group of duplicates the first in that order is kept, so the result is
the same however the work was split between processes.

Exact: documents with the same normalised text (lower case, punctuation and whitespace
ignored: cleaning/text.normal_words) have the same 16-byte BLAKE2 key; later ones go.

Near: documents that share a bucket in any LSH band (cleaning/minhash.py) are candidate
pairs; candidate pairs are joined into clusters with union-find, so A~B and B~C make one
cluster {A, B, C} even if A and C never met in a bucket; every cluster keeps its first.

Memory: the band keys of all documents live on disk (one (documents x bands) .npy per input
file, read a block of rows at a time); the buckets are formed one band at a time by an
external sort of that band's (key, document) records (cleaning/external_sort.py), so RAM
holds at most `run_records` records whatever the corpus size. What does grow with the
corpus is the union-find, one entry per document that shares a bucket: the answer itself.

Worked example, one band, documents 0-4 with keys [7, 3, 7, 9, 3]: sorted (key, document)
records (3,1) (3,4) (7,0) (7,2) (9,3) make buckets {1, 4}, {0, 2}, {3}; union-find joins
4 to 1 and 2 to 0, so documents 4 and 2 are near-duplicates of 1 and 0.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from data_preprocess.cleaning.external_sort import ExternalSorter

ROWS_PER_READ = 8192  # band-key rows read from a file at a time (8192 x 9 bands x 8 B = 590 KB)


def exact_key(words: list[str]) -> str:
    """What two exact copies share: the hash of their words (text.normal_words: case and
    punctuation ignored). Takes the words, not the text: MinHash shingles the same list."""
    return hashlib.blake2b(" ".join(words).encode("utf-8"), digest_size=16).hexdigest()


def exact_duplicates(keys: Iterable[tuple[int, str]]) -> dict[int, int]:
    """{later document: the first with the same key} over (document, key) pairs in order."""
    first_with: dict[str, int] = {}
    copies: dict[int, int] = {}
    for doc, key in keys:
        if key in first_with:
            copies[doc] = first_with[key]
        else:
            first_with[key] = doc
    return copies


class UnionFind:
    """Disjoint sets over document numbers; each set's representative is its smallest member,
    which is exactly the document a cluster keeps."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, item: int) -> int:
        root = item
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while item != root:  # path compression: later finds take one step
            self.parent[item], item = root, self.parent.get(item, item)
        return root

    def union(self, first: int, second: int) -> None:
        first, second = self.find(first), self.find(second)
        if first != second:
            self.parent[max(first, second)] = min(first, second)


@dataclass(frozen=True)
class BandFile:
    """One input file's band keys: row i of `path`, a (rows, bands) uint64 .npy written by
    the analysis, holds the keys of document `first_document + i`."""

    path: Path
    first_document: int
    rows: int


def npy_row_blocks(path: Path, rows_per_read: int) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
    """(the array's shape, the next block of rows) of a C-order .npy, read from the file.
    Not memory-mapped: mapped pages count as resident once touched, so a mapped file read
    to the end would sit in RAM whole, which this pass exists to avoid."""
    with open(path, "rb") as handle:
        version = npy_format.read_magic(handle)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"{path}: .npy version {version} (expected 1.0 or 2.0, np.save's)")
        read_header = (npy_format.read_array_header_1_0 if version == (1, 0)
                       else npy_format.read_array_header_2_0)
        shape, fortran_order, dtype = read_header(handle)
        if fortran_order or len(shape) != 2:
            raise ValueError(f"{path}: expected a C-order 2-D array, got shape {shape}")
        for start in range(0, shape[0], rows_per_read):
            count = min(rows_per_read, shape[0] - start) * shape[1]
            yield shape, np.fromfile(handle, dtype=dtype, count=count).reshape(-1, shape[1])


def in_sorted(values: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Whether each item is in the sorted array `values` (a binary search per item, so a block
    costs O(block x log values), not a pass over all of them)."""
    if len(values) == 0:
        return np.zeros(len(items), dtype=bool)
    found = np.searchsorted(values, items).clip(max=len(values) - 1)
    return values[found] == items


def band_records(band_file: BandFile, band: int, bands: int,
                 skip: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(keys, documents) of one band of one file, a block of rows at a time, without the
    documents in `skip` (sorted: exact copies, already dropped)."""
    first = band_file.first_document
    for shape, rows in npy_row_blocks(band_file.path, ROWS_PER_READ):
        if shape != (band_file.rows, bands) or rows.dtype != np.uint64:
            raise ValueError(f"{band_file.path}: {shape} {rows.dtype} band keys, expected "
                             f"({band_file.rows}, {bands}) uint64; delete {band_file.path.parent}"
                             f" to analyse again")
        docs = np.arange(first, first + len(rows), dtype=np.int64)
        first += len(rows)
        kept = ~in_sorted(skip, docs)
        yield rows[kept, band], docs[kept]


def bucket_pairs(pairs: Iterable[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """(first member, member) for every member of a bucket but its first. `pairs` are (key,
    document) in sorted order, so every run of equal keys is one bucket and its first
    document is its smallest: the worked example above gives (1, 4) and (0, 2)."""
    bucket_key, head = None, -1
    for key, doc in pairs:
        if key == bucket_key:
            yield head, doc
        else:  # a new bucket, whose first (smallest) document is `doc`
            bucket_key, head = key, doc


def band_pairs(band_files: Sequence[BandFile], band: int, bands: int, skip: np.ndarray,
               work_dir: Path, run_records: int) -> Iterator[tuple[int, int]]:
    """One band's candidate pairs (`bucket_pairs`): every file's (key, document) records of
    that band go through an external sort (cleaning/external_sort.py: at most `run_records`
    in RAM, sorted runs spilled to a directory of their own under `work_dir`), and the sorted
    stream is cut into buckets. `skip`: document numbers to leave out, sorted."""
    with ExternalSorter(work_dir, run_records) as sorter:
        for band_file in band_files:
            for keys, docs in band_records(band_file, band, bands, skip):
                sorter.add(keys, docs)
        yield from bucket_pairs(sorter.sorted_pairs())


def first_of_clusters(pairs: Iterable[tuple[int, int]]) -> dict[int, int]:
    """{document: the first of its cluster} for every document that is not first, the
    clusters being the connected components of the candidate pairs (union-find)."""
    union_find = UnionFind()
    for head, doc in pairs:
        union_find.union(head, doc)
    return {doc: root for doc in list(union_find.parent)
            if (root := union_find.find(doc)) != doc}


def near_duplicates(band_files: Sequence[BandFile], bands: int, skip: np.ndarray,
                    work_dir: Path, run_records: int) -> dict[int, int]:
    """{document: the first of its cluster} for every document that is not first, the
    candidate pairs of every band taken in one process. `skip`: document numbers to leave out
    (exact copies), sorted."""
    skip = np.asarray(skip, dtype=np.int64)
    return first_of_clusters(itertools.chain.from_iterable(
        band_pairs(band_files, band, bands, skip, work_dir, run_records)
        for band in range(bands)))
