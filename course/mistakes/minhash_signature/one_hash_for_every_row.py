"""the same hash function used for all k rows.

Each of the k rows needs its own random hash h_i(x) = (a_i x + b_i) mod p: with one hash the k
entries are k copies of one minimum, and the estimate is 0 or 1 instead of J with error
sqrt(J(1-J)/k).
"""

from __future__ import annotations

import numpy as np

from data_preprocess.cleaning.minhash import MAX_HASH, MERSENNE_PRIME, Permutations


def signature(hashes: np.ndarray, perms: Permutations) -> np.ndarray:
    if hashes.size == 0:
        return np.full(perms.num_perm, MAX_HASH, dtype=np.uint32)
    permuted = (perms.a[:1] * hashes[None, :] + perms.b[:1]) % np.uint64(MERSENNE_PRIME)
    smallest = (permuted & np.uint64(MAX_HASH)).min(axis=1).astype(np.uint32)
    return np.repeat(smallest, perms.num_perm)
