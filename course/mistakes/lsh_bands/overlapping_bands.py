"""bands that overlap (band b starts at entry b, not b x rows).

The b bands must be disjoint slices of r rows: sig[b*r:(b+1)*r]. Overlapping bands share
entries, their agreements are no longer independent, and the S-curve 1 - (1 - s^r)^b no longer
holds: pairs above the threshold are missed.
"""

from __future__ import annotations

import hashlib

import numpy as np


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    keys = np.empty(bands, dtype=np.uint64)
    for band in range(bands):
        chunk = sig[band:band + rows].tobytes()
        keys[band] = int.from_bytes(hashlib.blake2b(chunk, digest_size=8).digest(), "little")
    return keys
