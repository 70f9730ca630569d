"""An independent reader of Megatron's MMIDIDX `.idx`/`.bin` pair, written from the format
description in docs/design.md §2.3 alone.

Deliberately shares no code with data_preprocess/indexed_dataset.py: tests compare the two, so
a misunderstanding of the format in our writer cannot hide behind the same misunderstanding
in our reader.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

SPEC_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
               7: np.float32, 8: np.uint16}


def read_by_spec(prefix: str | Path) -> dict:
    """-> {"dtype", "sequences": [np.ndarray], "document_indices": np.ndarray}."""
    idx = Path(f"{prefix}.idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack("<Q", idx[9:17])
    assert version == 1
    (dtype_code,) = struct.unpack("<B", idx[17:18])
    sequence_count, document_count = struct.unpack("<QQ", idx[18:34])
    position = 34
    lengths = np.frombuffer(idx, dtype="<i4", count=sequence_count, offset=position)
    position += 4 * sequence_count
    pointers = np.frombuffer(idx, dtype="<i8", count=sequence_count, offset=position)
    position += 8 * sequence_count
    document_indices = np.frombuffer(idx, dtype="<i8", count=document_count, offset=position)
    position += 8 * document_count
    assert position == len(idx), "trailing bytes in .idx"
    dtype = np.dtype(SPEC_DTYPES[dtype_code]).newbyteorder("<")
    data = Path(f"{prefix}.bin").read_bytes()
    sequences = [np.frombuffer(data, dtype=dtype, count=int(length), offset=int(pointer))
                 for length, pointer in zip(lengths, pointers)]
    assert sum(int(n) for n in lengths) * dtype.itemsize == len(data), "bytes beyond the index"
    return {"dtype": SPEC_DTYPES[dtype_code], "sequences": sequences,
            "document_indices": document_indices}
