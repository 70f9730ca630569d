"""the same hash function used for all k rows.

Each of the k rows needs its own random hash h_i(x) = (a_i x + b_i) mod p: with one hash the k
entries are k copies of one minimum, and the estimate is 0 or 1 instead of J with error
sqrt(J(1-J)/k).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from data_preprocess.cleaning.minhash import MAX_HASH, MERSENNE_PRIME, Permutations


def signature(hashes: np.ndarray, perms: Permutations,
              starts: Sequence[int] | np.ndarray = (0,)) -> np.ndarray:
    starts = np.asarray(starts, dtype=np.intp)
    if hashes.size == 0:
        return np.full((len(starts), perms.num_perm), MAX_HASH, dtype=np.uint32)
    permuted = (hashes * perms.a[0, 0] + perms.b[0, 0]) % np.uint64(MERSENNE_PRIME)
    smallest = np.minimum.reduceat(permuted & np.uint64(MAX_HASH), starts).astype(np.uint32)
    return np.repeat(smallest[:, None], perms.num_perm, axis=1)
