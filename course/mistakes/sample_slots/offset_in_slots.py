"""the offset counted in slots, not tokens.

A slot is max_seq_len tokens long: the second column is a token offset into the file, so the
slot's index inside its file must be multiplied by max_seq_len.
"""

from __future__ import annotations

import numpy as np


def slot_pairs(global_slots: np.ndarray, first_slot_of_file: np.ndarray,
               max_seq_len: int) -> np.ndarray:
    file_index = np.searchsorted(first_slot_of_file, global_slots, side="right") - 1
    offsets = global_slots - first_slot_of_file[file_index]
    return np.stack([file_index, offsets], axis=1).astype("<i8")
