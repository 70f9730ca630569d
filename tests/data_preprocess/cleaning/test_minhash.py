"""MinHash and LSH from scratch against the truth and against datasketch: Jaccard estimates
(vs the exact Jaccard and vs datasketch's MinHash on the same shingles), the S-curve (vs a
simulation), and near-duplicate recall (vs datasketch's MinHashLSH at the same bands/rows)."""

from __future__ import annotations

import math
import random
import zlib

import numpy as np
import pytest

from data.dirty_corpus import distinct_documents, near_copy
from data_preprocess.cleaning import dedup, minhash
from data_preprocess.cleaning.text import normal_words

datasketch = pytest.importorskip("datasketch")

NUM_PERM = 128


def set_pair(rng: random.Random, jaccard: float, union: int = 400) -> tuple[set, set]:
    """Two shingle sets with exactly the given Jaccard index."""
    items = [f"shingle {rng.random()}" for _ in range(union)]
    shared = round(jaccard * union)
    rest = items[shared:]
    return set(items[:shared] + rest[::2]), set(items[:shared] + rest[1::2])


def their_minhash(shingle_set: set[str]):
    sketch = datasketch.MinHash(num_perm=NUM_PERM, seed=1)
    for shingle in sorted(shingle_set):
        sketch.update(shingle.encode("utf-8"))
    return sketch


def test_jaccard_estimate_within_expected_error_of_truth_and_datasketch():
    rng = random.Random(0)
    perms = minhash.Permutations.make(NUM_PERM, seed=0)
    errors_ours, errors_theirs = [], []
    for trial in range(60):
        jaccard = [0.1, 0.3, 0.5, 0.7, 0.9][trial % 5]
        first, second = set_pair(rng, jaccard)
        true = len(first & second) / len(first | second)
        ours = minhash.estimate_jaccard(
            minhash.signature(minhash.shingle_hashes(first), perms)[0],
            minhash.signature(minhash.shingle_hashes(second), perms)[0])
        theirs = their_minhash(first).jaccard(their_minhash(second))
        sigma = math.sqrt(true * (1 - true) / NUM_PERM)
        assert abs(ours - true) <= 4 * sigma, (true, ours)
        assert abs(ours - theirs) <= 4 * math.sqrt(2) * sigma, (true, ours, theirs)
        errors_ours.append((ours - true) / sigma)
        errors_theirs.append((theirs - true) / sigma)
    # Unbiased with the predicted spread, as datasketch: mean ~0, RMS ~1 in units of sigma.
    assert abs(np.mean(errors_ours)) < 0.5 and 0.6 < np.sqrt(np.mean(np.square(errors_ours))) < 1.4
    assert abs(np.sqrt(np.mean(np.square(errors_ours))) -
               np.sqrt(np.mean(np.square(errors_theirs)))) < 0.4


@pytest.mark.parametrize("shingles_per_block", [7, minhash.SHINGLES_PER_BLOCK])
def test_signatures_and_estimates_equal_datasketch_given_its_permutations(shingles_per_block):
    """Same shingle hash (CRC-32), same seed, same permutations (datasketch's "legacy" scheme,
    (a h + b) mod p with its own (a, b), whose products overflow 64 bits: our arithmetic must
    wrap as theirs does): every signature entry equals datasketch's, so every Jaccard estimate
    does too. Our own permutations keep a < 2^32 (no overflow); the formula is the same."""
    def sketch(words: list[str]):
        theirs = datasketch.MinHash(num_perm=NUM_PERM, seed=3, hashfunc=zlib.crc32,
                                     scheme="legacy")
        theirs.update_batch([s.encode("utf-8") for s in minhash.shingles(words, 5)])
        return theirs

    rng = random.Random(2)
    scenes = distinct_documents(rng, 4)
    texts = [*scenes, near_copy(scenes[0], rng, 0.05), near_copy(scenes[1], rng, 0.3), "a b"]
    sketches = [sketch(normal_words(text)) for text in texts]
    a, b = sketches[0].permutations
    perms = minhash.Permutations(a[:, None], b[:, None])
    ours = minhash.document_signatures([normal_words(text) for text in texts], 5, perms,
                                       shingles_per_block)
    for sig, theirs in zip(ours, sketches):
        assert np.array_equal(sig, theirs.hashvalues)
    for i in range(len(texts)):
        for j in range(len(texts)):
            assert minhash.estimate_jaccard(ours[i], ours[j]) == sketches[i].jaccard(sketches[j])


@pytest.mark.parametrize("b", [minhash.MERSENNE_PRIME - 3, minhash.MERSENNE_PRIME,
                               2 ** 64 - 9, 12345])
def test_signature_is_the_plain_formula_even_where_folding_lands_on_or_past_p(b):
    """(a h + b) mod p, & 2^32 - 1, min: computed with Python integers, wrapped at 2^64 as
    numpy's uint64 is. With a = 1 these b put a h + b on p, just past it, or around 2^64,
    where the division-free reduction needs its rare last subtraction."""
    hashes = np.arange(8, dtype=np.uint64)
    perms = minhash.Permutations(np.array([[1], [3]], dtype=np.uint64),
                                 np.array([[b], [b]], dtype=np.uint64))
    expected = [min((((a * h + b) % 2**64) % minhash.MERSENNE_PRIME) & minhash.MAX_HASH
                    for h in range(8)) for a in (1, 3)]
    assert minhash.signature(hashes, perms)[0].tolist() == expected


def test_s_curve_matches_simulated_banding():
    """P(candidate) from the formula vs the fraction of simulated signature pairs that share
    a band, at the bands/rows chosen for threshold 0.7 (the midpoint printed for the reader)."""
    bands, rows = minhash.choose_bands(0.7, NUM_PERM)
    print(f"threshold 0.7 -> {bands} bands x {rows} rows, 50% point "
          f"{minhash.s_curve_midpoint(bands, rows):.3f}")
    assert abs(minhash.s_curve_midpoint(bands, rows) - 0.7) < 0.05
    rng = np.random.default_rng(0)
    for similarity in (0.5, 0.7, 0.85):
        agree = rng.random((4000, bands * rows)) < similarity  # each entry equal w.p. s
        simulated = agree.reshape(4000, bands, rows).all(axis=2).any(axis=1).mean()
        expected = minhash.candidate_probability(similarity, bands, rows)
        assert abs(simulated - expected) < 4 * math.sqrt(expected * (1 - expected) / 4000) + 1e-3


def our_clusters(texts: list[str], threshold: float, tmp_path) -> dict[int, int]:
    bands, rows = minhash.choose_bands(threshold, NUM_PERM)
    perms = minhash.Permutations.make(NUM_PERM, seed=0)
    keys = np.stack([minhash.band_keys(minhash.signature(minhash.shingle_hashes(
        minhash.shingles(normal_words(text), 5)), perms)[0], bands, rows) for text in texts])
    np.save(tmp_path / "keys.npy", keys)
    return dedup.near_duplicates([dedup.BandFile(tmp_path / "keys.npy", 0, len(texts))], bands,
                                 skip=np.empty(0, np.int64), work_dir=tmp_path,
                                 run_records=1000)


@pytest.mark.parametrize("changed", [0.01, 0.03])
def test_lsh_recall_at_least_datasketch_and_no_distinct_document_removed(tmp_path, changed):
    rng = random.Random(1)
    originals = distinct_documents(rng, 150)
    copies = [near_copy(text, rng, changed) for text in originals]
    threshold = 0.7
    copy_of = our_clusters(originals + copies, threshold, tmp_path)
    assert all(doc >= len(originals) for doc in copy_of), "a distinct original was dropped"
    ours = sum(copy_of.get(len(originals) + i) == i for i in range(len(originals)))

    bands, rows = minhash.choose_bands(threshold, NUM_PERM)
    lsh = datasketch.MinHashLSH(num_perm=NUM_PERM, params=(bands, rows))
    for i, text in enumerate(originals):
        lsh.insert(i, their_minhash(minhash.shingles(normal_words(text), 5)))
    theirs = sum(i in lsh.query(their_minhash(minhash.shingles(normal_words(copy), 5)))
                 for i, copy in enumerate(copies))
    print(f"{changed:.0%} of words changed: recall ours {ours}/150, datasketch {theirs}/150")
    # Both draw their hashes at random: allow two binomial standard errors of sampling noise.
    p = max(theirs / 150, 1 / 150)
    assert ours >= theirs - 2 * math.sqrt(150 * p * (1 - p)), (ours, theirs)
    if changed == 0.01:  # J ~ 0.9, far above the 50% point: nearly every copy is found
        assert ours >= 0.95 * len(originals)


def test_exact_duplicates_ignore_case_spacing_punctuation():
    keys = [(i, dedup.exact_key(normal_words(text))) for i, text in
            enumerate(["The king, he is dead.", "a different one", "the KING he is   dead!"])]
    assert dedup.exact_duplicates(keys) == {2: 0}


def test_union_find_chains_and_keeps_smallest():
    union_find = dedup.UnionFind()
    union_find.union(5, 3)
    union_find.union(9, 5)
    union_find.union(7, 8)
    assert [union_find.find(i) for i in (3, 5, 9, 7, 8)] == [3, 3, 3, 7, 7]


def test_skipped_documents_join_no_bucket_across_files(tmp_path):
    """Documents 0-2 in one band file and 3-4 in the next share a key; skipping 0 (an exact
    copy) makes 1 the first of the cluster, and the second file's rows are numbered 3, 4."""
    np.save(tmp_path / "a.npy", np.array([[7, 1], [7, 2], [7, 3]], dtype=np.uint64))
    np.save(tmp_path / "b.npy", np.array([[7, 4], [9, 5]], dtype=np.uint64))
    band_files = [dedup.BandFile(tmp_path / "a.npy", 0, 3),
                  dedup.BandFile(tmp_path / "b.npy", 3, 2)]
    for skip, expected in (([], {1: 0, 2: 0, 3: 0}), ([0], {2: 1, 3: 1})):
        assert dedup.near_duplicates(band_files, 2, np.array(skip, dtype=np.int64), tmp_path,
                                     run_records=3) == expected


def test_band_file_of_the_wrong_shape_is_refused_by_name(tmp_path):
    np.save(tmp_path / "a.jsonl.bands.npy", np.zeros((3, 4), dtype=np.uint64))
    with pytest.raises(ValueError, match=r"a.jsonl.bands.npy: \(3, 4\) uint64 band keys, "
                                         r"expected \(5, 4\) uint64; delete"):
        dedup.near_duplicates([dedup.BandFile(tmp_path / "a.jsonl.bands.npy", 0, 5)], 4,
                              np.empty(0, np.int64), tmp_path, run_records=10)
