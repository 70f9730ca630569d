"""a file's first slot given to the file before it.

np.searchsorted(..., side='left') puts a slot equal to a file's first slot before that file: the
file holding slot s is the last one whose first slot is <= s (side='right', minus one).
"""

from __future__ import annotations

import numpy as np


def slot_pairs(global_slots: np.ndarray, first_slot_of_file: np.ndarray,
               max_seq_len: int) -> np.ndarray:
    file_index = np.maximum(np.searchsorted(first_slot_of_file, global_slots) - 1, 0)
    offsets = (global_slots - first_slot_of_file[file_index]) * max_seq_len
    return np.stack([file_index, offsets], axis=1).astype("<i8")
