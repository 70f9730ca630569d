"""MinHash of a document of any size in bounded memory: the signature is taken over chunks of
shingles (minhash.document_signature), equal to the one taken over the whole shingle set, and
its peak allocation does not grow with the document (one 50 MB document once asked for 8 GiB)."""

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
    return minhash.signature(minhash.shingle_hashes(minhash.shingles(words, n)), PERMS)


@pytest.mark.parametrize("shingles_per_chunk", [1, 3, 64, minhash.SHINGLES_PER_CHUNK])
def test_chunked_signature_equals_the_whole_set_signature(shingles_per_chunk):
    texts = distinct_documents(random.Random(0), 6) + [
        "", "two words", "exactly five words are here", "six words are here this time",
        "the cat sat " * 40]  # repeats: a shingle seen again cannot change a minimum
    for text in texts:
        for n in (1, 5):
            words = normal_words(text)
            chunked = minhash.document_signature(words, n, PERMS, shingles_per_chunk)
            assert np.array_equal(chunked, whole_set_signature(words, n)), (text[:40], n)


def test_peak_memory_is_one_chunk_not_the_document():
    """Ten chunks' worth of shingles at the default chunk size: the permuted block of all of
    them would be 10 x 128 x 8,192 x 8 bytes = 80 MiB per temporary; the chunked signature
    holds a few temporaries of one chunk (8 MiB each)."""
    words = [f"w{i}" for i in range(10 * minhash.SHINGLES_PER_CHUNK)]
    one_chunk_bytes = PERMS.num_perm * minhash.SHINGLES_PER_CHUNK * 8
    tracemalloc.start()
    try:
        minhash.document_signature(words, 5, PERMS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * one_chunk_bytes, peak / 2**20
