"""MinHash signatures and LSH banding: find near-duplicate documents without comparing every
pair (Broder 1997; Leskovec, Rajaraman & Ullman, "Mining of Massive Datasets", ch. 3).

1. Shingles: a document becomes the *set* of its word n-grams (5 words by default, after
   normal_words: lower case, no punctuation). Two documents' similarity is the Jaccard index
   of their sets, J = |A ∩ B| / |A ∪ B|.
2. MinHash: apply a random hash h_i to every shingle and keep the minimum. The minimum is
   equally likely to be any shingle of A ∪ B, so P[min h_i(A) = min h_i(B)] = J exactly.
   With k independent hashes (here h_i(x) = (a_i x + b_i) mod p, p = 2^61 - 1, seeded) the
   fraction of equal signature entries estimates J with standard error sqrt(J(1-J)/k).
3. LSH banding: cut the k entries into b bands of r rows. Two documents become a
   *candidate pair* if they agree on all r rows of at least one band:
       P(candidate | J = s) = 1 - (1 - s^r)^b        (an S-shaped curve in s)
   Worked example, b = 9 bands x r = 13 rows (117 of 128 hashes; what a threshold of 0.8 picks):
       s = 0.70 -> 1 - (1 - 0.70^13)^9 = 0.08     s = 0.80 -> 0.40     s = 0.90 -> 0.93
   and the curve crosses 50% at s = (1 - 0.5^(1/b))^(1/r) = 0.82. (A threshold of 0.7
   picks 14 x 9, 50% point 0.71.) More rows per band move
   the curve right (stricter); more bands move it left (more recall).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

MERSENNE_PRIME = (1 << 61) - 1  # p: a prime larger than every 32-bit shingle hash
MAX_HASH = (1 << 32) - 1  # signatures keep 32 bits: half the memory, collisions still rare
T = TypeVar("T")


SHINGLES_PER_BLOCK = 16_384  # permuted at once: a few 128 KiB arrays, in one core's L2 cache


def windows(items: Sequence[T], n: int) -> Iterator[tuple[T, ...]]:
    """Every run of n consecutive items, in order, repeats included (zip over n shifted
    views: no Python loop per window); fewer than n items make one run of all of them."""
    if len(items) < n:
        return iter([tuple(items)])
    return zip(*(items[shift:] for shift in range(n)))


def shingles(words: Sequence[str], n: int) -> set[str]:
    """The set of word n-grams (the document as MinHash sees it; step 1 above)."""
    return set(map(" ".join, windows(words, n)))


def shingle_hashes(shingle_set: Iterable[str]) -> np.ndarray:
    """Each shingle -> a 32-bit value (CRC-32: fast, in C, and the same in every process,
    unlike Python's salted hash()). Sorted, so the result does not depend on set order."""
    return np.array(sorted(zlib.crc32(s.encode("utf-8")) for s in shingle_set), dtype=np.uint64)


@dataclass(frozen=True)
class Permutations:
    """k seeded hash functions h_i(x) = (a_i x + b_i) mod p, as two arrays."""

    a: np.ndarray  # (k, 1) uint64 in [1, 2^32): a_i * x < 2^64, so no overflow before mod p
    b: np.ndarray  # (k, 1) uint64 in [0, 2^32)

    @classmethod
    def make(cls, num_perm: int, seed: int) -> Permutations:
        rng = np.random.default_rng(seed)
        a = rng.integers(1, MAX_HASH, size=(num_perm, 1), dtype=np.uint64)
        b = rng.integers(0, MAX_HASH, size=(num_perm, 1), dtype=np.uint64)
        return cls(a, b)

    @property
    def num_perm(self) -> int:
        return len(self.a)


def signature(hashes: np.ndarray, perms: Permutations,
              starts: Sequence[int] | np.ndarray = (0,)) -> np.ndarray:
    """The k minimums of each document's shingles: a (documents, k) uint32 array.

    `hashes` holds the shingle hashes of one or more documents laid end to end; document d's
    run begins at `starts[d]` (increasing; a run is never empty). With the default, all of
    `hashes` is one document. Worked example, 2 permutations, starts = [0, 3]:
        hashes          [h0 h1 h2 | h3 h4]
        permutation 0   [ 9  4  7 |  5  8]  -> minimums [4, 5]  (column 0 of the result)
        permutation 1   [ 2  6  3 |  1  0]  -> minimums [2, 0]  (column 1)
    Step 1: one permutation at a time, applied to every shingle of the block: (a_i x + b_i)
    with scalars a_i, b_i, so numpy runs each line as one vector loop (a (k, shingles) matrix
    with broadcast (k, 1) operands ran 1.7x slower). The arithmetic wraps modulo 2^64 as
    datasketch's does, so its own (a, b) give its values.
    Step 2: mod p by folding (`fold_mod_mersenne`); values >= p after the fold (a chance of
    about 8 in 2^61 each) still need their last subtraction, and one max over the block says
    whether any do, cheaper than a masked subtraction.
    Step 3: keep the low 32 bits (& MAX_HASH) and take each document's minimum with
    np.minimum.reduceat over the runs."""
    starts = np.asarray(starts, dtype=np.intp)
    result = np.full((len(starts), perms.num_perm), MAX_HASH, dtype=np.uint32)
    if hashes.size == 0:
        return result
    permuted, high = np.empty_like(hashes), np.empty_like(hashes)
    low_bits = np.empty(hashes.shape, dtype=np.uint32)
    for i, (a, b) in enumerate(zip(perms.a[:, 0], perms.b[:, 0])):
        np.multiply(hashes, a, out=permuted)  # Step 1
        permuted += b
        fold_mod_mersenne(permuted, high)  # Step 2
        if permuted.max() >= MERSENNE_PRIME:
            np.subtract(permuted, np.uint64(MERSENNE_PRIME), out=permuted,
                        where=permuted >= np.uint64(MERSENNE_PRIME))
        np.copyto(low_bits, permuted, casting="unsafe")  # Step 3: the cast keeps the low 32 bits
        result[:, i] = np.minimum.reduceat(low_bits, starts)
    return result


def fold_mod_mersenne(values: np.ndarray, high: np.ndarray) -> None:
    """values reduced mod p = 2^61 - 1 *up to one p*, in place, without a division (numpy's %
    is a slow integer division): write x = hi * 2^61 + lo; since 2^61 = p + 1,
    x = hi + lo (mod p), and hi + lo < 2^61 + 8 is x mod p, or x mod p + p when it is >= p.
    `high`: scratch space of the same shape, so that a loop allocates nothing."""
    np.right_shift(values, np.uint64(61), out=high)
    values &= np.uint64(MERSENNE_PRIME)
    values += high


def window_hashes(words: Sequence[str], n: int, start: int, stop: int) -> np.ndarray:
    """The CRC-32 (as `shingle_hashes`) of the shingles starting at words start .. stop-1,
    repeats included (they cannot change a minimum). Each word is encoded once; joining and
    hashing run in C over `windows` of the encoded words, with no Python code per shingle."""
    encoded = list(map(str.encode, words[start:stop + n - 1]))
    return np.fromiter(map(zlib.crc32, map(b" ".join, windows(encoded, n))), dtype=np.uint64,
                       count=stop - start)


def shingle_blocks(documents: Sequence[Sequence[str]], n: int, shingles_per_block: int
                   ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(hashes, starts, owners) blocks of at most `shingles_per_block` shingle hashes, the
    documents' runs laid end to end: run r begins at starts[r] and belongs to document
    owners[r]. A document longer than the room left is cut across blocks."""
    pieces: list[np.ndarray] = []
    starts: list[int] = []
    owners: list[int] = []
    filled = 0
    for owner, words in enumerate(documents):
        count = max(len(words) - n + 1, 1)  # at most n words: one shingle of all of them
        done = 0
        while done < count:
            take = min(count - done, shingles_per_block - filled)
            pieces.append(window_hashes(words, n, done, done + take))
            starts.append(filled)
            owners.append(owner)
            filled, done = filled + take, done + take
            if filled == shingles_per_block:
                yield np.concatenate(pieces), np.array(starts), np.array(owners)
                pieces, starts, owners, filled = [], [], [], 0
    if pieces:
        yield np.concatenate(pieces), np.array(starts), np.array(owners)


def document_signatures(documents: Sequence[Sequence[str]], n: int, perms: Permutations,
                        shingles_per_block: int = SHINGLES_PER_BLOCK) -> np.ndarray:
    """The signature of each document's word n-grams: a (documents, k) uint32 array.

    Many documents share one block (numpy's per-call cost is paid per block, not per
    document), and a long one spans several: a minimum over all shingles is the minimum of
    the blocks' minimums, and a repeated shingle cannot change a minimum, so row d equals
    `signature(shingle_hashes(shingles(documents[d], n)))` while holding one block (permuting
    a 50 MB document's shingles at once would need gigabytes)."""
    result = np.full((len(documents), perms.num_perm), MAX_HASH, dtype=np.uint32)
    for hashes, starts, owners in shingle_blocks(documents, n, shingles_per_block):
        result[owners] = np.minimum(result[owners], signature(hashes, perms, starts))
    return result


def estimate_jaccard(first: np.ndarray, second: np.ndarray) -> float:
    """The fraction of equal entries: an unbiased estimate of the two sets' Jaccard index."""
    return float(np.mean(first == second))


def candidate_probability(similarity: np.ndarray | float, bands: int, rows: int) -> np.ndarray:
    """The S-curve: chance that two documents of Jaccard `similarity` share a band bucket."""
    return 1.0 - (1.0 - np.asarray(similarity, dtype=float) ** rows) ** bands


def s_curve_midpoint(bands: int, rows: int) -> float:
    """The similarity at which a pair becomes a candidate with probability 1/2."""
    return float((1.0 - 0.5 ** (1.0 / bands)) ** (1.0 / rows))


def choose_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows), bands x rows <= num_perm, minimising the area of false positives
    (pairs below `threshold` that become candidates) plus false negatives (pairs above it
    that do not), both integrated over similarity on a fine grid."""
    below = np.linspace(0.0, threshold, 200)
    above = np.linspace(threshold, 1.0, 200)
    best, best_error = (1, 1), float("inf")
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            false_pos = np.trapezoid(candidate_probability(below, bands, rows), below)
            false_neg = np.trapezoid(1 - candidate_probability(above, bands, rows), above)
            if false_pos + false_neg < best_error:
                best, best_error = (bands, rows), false_pos + false_neg
    return best


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """One 64-bit bucket key per band: a hash of that band's r signature entries."""
    keys = np.empty(bands, dtype=np.uint64)
    for band in range(bands):
        chunk = sig[band * rows:(band + 1) * rows].tobytes()
        keys[band] = int.from_bytes(hashlib.blake2b(chunk, digest_size=8).digest(), "little")
    return keys
