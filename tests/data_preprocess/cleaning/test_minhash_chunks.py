"""MinHash of many documents at once and of a document of any size in bounded memory: the
signatures are taken over blocks of shingles laid end to end (minhash.document_signatures;
a block holds many documents, a long document spans several blocks), each row equal to the
signature taken over that document's whole shingle set, and the peak allocation does not
grow with the document (one 50 MB document once asked for 8 GiB)."""

from __future__ import annotations

import random
import tracemalloc

import numpy as np
import pytest

from data.dirty_corpus import distinct_documents
from data_preprocess.cleaning import minhash
from data_preprocess.cleaning.text import normal_words

PERMS = minhash.Permutations.make(128, seed=0)


def whole_set_signature(words: list[str], n: int) -> np.ndarray:
    return minhash.signature(minhash.shingle_hashes(minhash.shingles(words, n)), PERMS)[0]


@pytest.mark.parametrize("shingles_per_block", [1, 3, 64, minhash.SHINGLES_PER_BLOCK])
def test_blocked_signatures_equal_the_whole_set_signatures(shingles_per_block):
    texts = distinct_documents(random.Random(0), 6) + [
        "", "two words", "exactly five words are here", "six words are here this time",
        "the cat sat " * 40]  # repeats: a shingle seen again cannot change a minimum
    word_lists = [normal_words(text) for text in texts]
    for n in (1, 5):
        blocked = minhash.document_signatures(word_lists, n, PERMS, shingles_per_block)
        for words, row in zip(word_lists, blocked):
            assert np.array_equal(row, whole_set_signature(words, n)), (words[:8], n)


def test_peak_memory_is_one_block_not_the_document():
    """Ten blocks' worth of shingles at the default block size: permuting all of them at
    once, as a (k, shingles) matrix, would take 128 x 163,840 x 8 bytes = 160 MiB per
    temporary; the blocked signature holds a few 1-D arrays of one block."""
    words = [f"w{i}" for i in range(10 * minhash.SHINGLES_PER_BLOCK)]
    one_block_matrix_bytes = PERMS.num_perm * minhash.SHINGLES_PER_BLOCK * 8
    tracemalloc.start()
    try:
        minhash.document_signatures([words], 5, PERMS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < one_block_matrix_bytes / 4, peak / 2**20
