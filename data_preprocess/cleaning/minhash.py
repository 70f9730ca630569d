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

import collections
import hashlib
import itertools
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

MERSENNE_PRIME = (1 << 61) - 1  # p: a prime larger than every 32-bit shingle hash
MAX_HASH = (1 << 32) - 1  # signatures keep 32 bits: half the memory, collisions still rare


SHINGLES_PER_CHUNK = 8192  # permuted at once: k x 8,192 x 8 bytes = 8 MiB at k = 128


def iter_shingles(words: Iterable[str], n: int) -> Iterator[str]:
    """Every word n-gram in text order, repeats included, from a sliding window (nothing but
    the window is held); a document of at most n words is one shingle of all of it."""
    window: collections.deque[str] = collections.deque(maxlen=n)
    words = iter(words)
    window.extend(itertools.islice(words, n))
    yield " ".join(window)
    for word in words:
        window.append(word)
        yield " ".join(window)


def shingles(words: list[str], n: int) -> set[str]:
    """The set of word n-grams (the document as MinHash sees it; step 1 above)."""
    return set(iter_shingles(words, n))


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


def fold_mod_mersenne(values: np.ndarray) -> np.ndarray:
    """values reduced mod p = 2^61 - 1 *up to one p*, in place, without a division (numpy's %
    is a slow integer division): write x = hi * 2^61 + lo; since 2^61 = p + 1,
    x = hi + lo (mod p), and hi + lo < 2^61 + 8 is x mod p, or x mod p + p when it is >= p."""
    high = values >> np.uint64(61)
    values &= np.uint64(MERSENNE_PRIME)
    values += high
    return values


def signature(hashes: np.ndarray, perms: Permutations) -> np.ndarray:
    """The k minimums over all shingles: a (k,) uint32 array (all MAX_HASH if no shingles).
    One (k, shingles) product: every permutation applied to every shingle at once. The
    arithmetic wraps modulo 2^64 as datasketch's does, so its own (a, b) give its values.
    Folded values >= p (a chance of about 8 in 2^61 each) still need their last subtraction;
    one max over the block says whether any do, cheaper than a masked subtraction."""
    if hashes.size == 0:
        return np.full(perms.num_perm, MAX_HASH, dtype=np.uint32)
    permuted = perms.a * hashes[None, :]
    permuted += perms.b
    fold_mod_mersenne(permuted)
    if permuted.max() >= MERSENNE_PRIME:
        np.subtract(permuted, np.uint64(MERSENNE_PRIME), out=permuted,
                    where=permuted >= np.uint64(MERSENNE_PRIME))
    return permuted.astype(np.uint32).min(axis=1)  # the cast keeps the low 32 bits (& MAX_HASH)


def chunk_hashes(words: Sequence[str], n: int, start: int, stop: int) -> np.ndarray:
    """The CRC-32 (as `shingle_hashes`) of the shingles starting at words start .. stop-1,
    repeats included (they cannot change a minimum), in one C-level map over the chunk."""
    shingle_texts = [" ".join(words[i:i + n]).encode("utf-8") for i in range(start, stop)]
    return np.fromiter(map(zlib.crc32, shingle_texts), dtype=np.uint64,
                       count=len(shingle_texts))


def document_signature(words: Sequence[str], n: int, perms: Permutations,
                       shingles_per_chunk: int = SHINGLES_PER_CHUNK) -> np.ndarray:
    """`signature` of the document's shingles, taken `shingles_per_chunk` at a time.

    A minimum over all shingles is the minimum of the chunks' minimums, and a repeated shingle
    cannot change a minimum, so this equals `signature(shingle_hashes(shingles(words, n)))`
    while holding one chunk: permuting every shingle at once needs k x 8 bytes per shingle
    (a 50 MB document asked for 8 GiB)."""
    result = np.full(perms.num_perm, MAX_HASH, dtype=np.uint32)
    count = max(len(words) - n + 1, 1)  # at most n words: one shingle of all of them
    for start in range(0, count, shingles_per_chunk):
        hashes = chunk_hashes(words, n, start, min(start + shingles_per_chunk, count))
        np.minimum(result, signature(hashes, perms), out=result)
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
