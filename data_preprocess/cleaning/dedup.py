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
file); the buckets are formed one band at a time, reading only that band's column of every
file, so at any moment RAM holds one key and one id per document (16 bytes), not the whole
signature (4 bytes x 128 hashes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from data_preprocess.cleaning.text import normal_words


def exact_key(text: str) -> str:
    """What two exact copies share: the hash of their words, case and punctuation ignored."""
    return hashlib.blake2b(" ".join(normal_words(text)).encode("utf-8"),
                           digest_size=16).hexdigest()


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


def union_bucket_members(union_find: UnionFind, docs: np.ndarray, keys: np.ndarray) -> None:
    """Join the documents that share a key (one band): sort by key, and every run of equal
    keys is one bucket, whose members are all joined to its first."""
    listed = docs >= 0  # -1: a row whose document was already dropped (an exact copy)
    docs, keys = docs[listed], keys[listed]
    order = np.lexsort((docs, keys))
    sorted_keys, sorted_docs = keys[order], docs[order]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    sizes = np.diff(np.r_[starts, len(sorted_keys)])
    for start, size in zip(starts[sizes > 1], sizes[sizes > 1]):
        head = int(sorted_docs[start])
        for other in sorted_docs[start + 1:start + size]:
            union_find.union(head, int(other))


def near_duplicates(band_files: Sequence[tuple[np.ndarray, Path]], bands: int) -> dict[int, int]:
    """{document: the first of its cluster} for every document that is not first.

    band_files: per input file, (the document numbers of its rows, the .npy of their band
    keys, shape (rows, bands)); a document number of -1 marks a row to ignore.
    """
    union_find = UnionFind()
    for band in range(bands):
        docs = np.concatenate([ids for ids, _ in band_files] or [np.empty(0, np.int64)])
        keys = np.concatenate([np.load(path, mmap_mode="r")[:, band] for _, path in band_files]
                              or [np.empty(0, np.uint64)])
        union_bucket_members(union_find, docs.astype(np.int64), keys)
    return {doc: root for doc in list(union_find.parent)
            if (root := union_find.find(doc)) != doc}
