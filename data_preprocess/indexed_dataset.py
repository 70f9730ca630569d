"""Token files in Megatron-LM's `MMIDIDX` indexed-dataset format: a `.bin` and an `.idx` file.

Why this format: the `.bin` is nothing but token ids back to back, so a dataset can memory-map
it and slice any window without reading the rest; the `.idx` says where each sequence starts.
Being byte-compatible with Megatron-LM means a user can take their data there unchanged.

Vocabulary: a *sequence* is one run of token ids (a pretraining document, an SFT sample, or
one side of a DPO pair); a *document* is a group of consecutive sequences (Megatron's unit for
"do not split across this boundary"). Pretraining and SFT put one sequence in each document;
DPO puts two (chosen, rejected).

Worked example: three documents with 3, 1 and 2 tokens, one sequence each, dtype uint16.

    .bin (12 bytes)  ids: 17 42 7 | 9 | 100 3   (each a little-endian uint16)

    .idx
    offset  bytes  field                                  value
    0       9      magic                                  b"MMIDIDX\\x00\\x00"
    9       8      version, <Q                            1
    17      1      dtype code, <B                         8  (uint16; table DTYPE_CODES)
    18      8      sequence count, <Q                     3
    26      8      document count, <Q                     4  (= documents + 1)
    34      12     sequence lengths, int32[3]             [3, 1, 2]
    46      24     sequence byte offsets in .bin, int64   [0, 6, 8]
    70      32     document indices, int64[4]             [0, 1, 2, 3]

Document indices start with 0 and then list, after each document, the index of the first
sequence *after* it; document d owns sequences `document_indices[d] : document_indices[d+1]`.
For a DPO file with pairs (chosen, rejected) they read [0, 2, 4, ...].

Writing is crash-safe: both files are written under temporary names and renamed only when
complete (utils/atomic_io), so no reader ever sees a half-written `.bin` or `.idx`.
"""

from __future__ import annotations

import array
import contextlib
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from utils.atomic_io import atomic_open

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# Megatron-LM's dtype codes (megatron/core/datasets/indexed_dataset.py, DType enum).
DTYPE_CODES: dict[type, int] = {
    np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4,
    np.int64: 5, np.float64: 6, np.float32: 7, np.uint16: 8,
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
HEADER_BYTES = len(MAGIC) + 8 + 1 + 8 + 8  # magic, version, dtype code, two counts = 34


def token_dtype(vocab_size: int) -> type:
    """uint16 halves the disk and page-cache footprint; it holds ids below 65500
    (docs/design.md §2.3)."""
    return np.uint16 if vocab_size < 65500 else np.int32


def prefix_paths(prefix: str | Path) -> tuple[Path, Path]:
    """`data/a` -> (`data/a.bin`, `data/a.idx`); the prefix carries no extension."""
    prefix = Path(prefix)
    return prefix.with_name(prefix.name + ".bin"), prefix.with_name(prefix.name + ".idx")


class IndexedDatasetWriter:
    """Append sequences to `<prefix>.bin`, then write `<prefix>.idx`; both appear atomically.

        with IndexedDatasetWriter("out/wiki", np.uint16) as writer:
            writer.add_document([[17, 42, 7]])      # one document, one sequence
            writer.add_document([[9], [100, 3]])    # one document, two sequences

    Only the sequence lengths and document indices (12 bytes per sequence) stay in memory,
    never the tokens. If the block raises, neither file appears and whatever was at the final
    names is left untouched.
    """

    def __init__(self, prefix: str | Path, dtype: type) -> None:
        if dtype not in DTYPE_CODES:
            raise ValueError(f"dtype {dtype} has no MMIDIDX code; use one of {list(DTYPE_CODES)}")
        self.bin_path, self.idx_path = prefix_paths(prefix)
        self.dtype = dtype
        # Compact C arrays, not lists: 12 bytes per sequence instead of ~70 for Python ints.
        self.sequence_lengths = array.array("i")  # int32
        self.document_indices = array.array("q", [0])  # int64
        self._files = contextlib.ExitStack()
        self._bin_file: IO[Any] | None = None

    def __enter__(self) -> IndexedDatasetWriter:
        self._bin_file = self._files.enter_context(atomic_open(self.bin_path, "wb"))
        return self

    def add_document(self, sequences: Sequence[Sequence[int] | np.ndarray]) -> None:
        """Write one document made of one or more sequences of token ids."""
        for sequence in sequences:
            self.add_tokens(np.asarray(sequence, dtype=self.dtype), [len(sequence)])
        self.document_indices.append(len(self.sequence_lengths))

    def add_tokens(self, tokens: np.ndarray, sequence_lengths: Sequence[int]) -> None:
        """Fast path: many sequences already concatenated into one array of `self.dtype`."""
        assert tokens.dtype == self.dtype and tokens.size == sum(sequence_lengths)
        self._bin_file.write(tokens.tobytes())  # .bin: the ids, back to back, nothing else
        self.sequence_lengths.extend(sequence_lengths)

    def end_documents(self, sequences_per_document: int) -> None:
        """Close documents over the sequences added since the last boundary, n per document."""
        start = self.document_indices[-1] + sequences_per_document
        stop = len(self.sequence_lengths) + 1
        self.document_indices.extend(range(start, stop, sequences_per_document))
        assert self.document_indices[-1] == len(self.sequence_lengths), "unfinished document"

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is not None:
            self._files.__exit__(exc_type, exc, traceback)  # removes the temp .bin
            return
        self._files.close()  # .bin complete: fsync + rename to its final name
        lengths = np.frombuffer(self.sequence_lengths, dtype=np.int32)
        itemsize = np.dtype(self.dtype).itemsize
        offsets = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], dtype=np.int64, out=offsets[1:])
        offsets *= itemsize
        with atomic_open(self.idx_path, "wb") as idx:
            idx.write(MAGIC)  # 9 bytes: identifies the format
            idx.write(struct.pack("<Q", VERSION))  # uint64: format version, 1
            idx.write(struct.pack("<B", DTYPE_CODES[self.dtype]))  # uint8: dtype of .bin ids
            idx.write(struct.pack("<Q", len(lengths)))  # uint64: sequence count
            idx.write(struct.pack("<Q", len(self.document_indices)))  # uint64: document count
            idx.write(lengths.tobytes())  # int32 per sequence: its length in tokens
            idx.write(offsets.tobytes())  # int64 per sequence: its byte offset in .bin
            idx.write(np.frombuffer(self.document_indices, np.int64).tobytes())  # int64 each


class IndexedDataset:
    """Read-only, memory-mapped view of a `<prefix>.bin` / `<prefix>.idx` pair.

    `dataset[i]` is sequence i as a numpy view (no copy); `dataset.tokens` is the whole `.bin`
    as one flat array, the "token stream" that pretraining samples are cut from.
    """

    def __init__(self, prefix: str | Path) -> None:
        self.bin_path, self.idx_path = prefix_paths(prefix)
        header = b""
        if self.idx_path.exists():
            with open(self.idx_path, "rb") as handle:  # the header only: .idx can be large
                header = handle.read(HEADER_BYTES)
        if len(header) < HEADER_BYTES or header[: len(MAGIC)] != MAGIC:
            raise ValueError(f"{self.idx_path}: not an MMIDIDX index (missing or bad magic)")
        version, code, sequence_count, document_count = struct.unpack_from(
            "<QBQQ", header, len(MAGIC))
        if version != VERSION or code not in CODE_DTYPES:
            raise ValueError(f"{self.idx_path}: unsupported version {version} or dtype {code}")
        expected_idx_bytes = HEADER_BYTES + 12 * sequence_count + 8 * document_count
        if self.idx_path.stat().st_size != expected_idx_bytes:
            raise ValueError(f"{self.idx_path}: {self.idx_path.stat().st_size} bytes, but its "
                             f"header promises {expected_idx_bytes} ({sequence_count} sequences, "
                             f"{document_count} document indices); the file is damaged")
        self.dtype = CODE_DTYPES[code]
        index = np.memmap(self.idx_path, dtype=np.uint8, mode="r")
        position = HEADER_BYTES
        self.sequence_lengths = index[position: position + 4 * sequence_count].view(np.int32)
        position += 4 * sequence_count
        self.sequence_pointers = index[position: position + 8 * sequence_count].view(np.int64)
        position += 8 * sequence_count
        self.document_indices = index[position: position + 8 * document_count].view(np.int64)
        self.num_tokens = int(self.sequence_lengths.sum(dtype=np.int64))
        expected_bytes = self.num_tokens * np.dtype(self.dtype).itemsize
        actual_bytes = self.bin_path.stat().st_size if self.bin_path.exists() else -1
        if actual_bytes != expected_bytes:
            raise ValueError(f"{self.bin_path}: {actual_bytes} bytes, but {self.idx_path} "
                             f"describes {expected_bytes}; the pair does not belong together")
        # np.memmap refuses empty files; an empty dataset is still a valid dataset.
        self.tokens = (np.memmap(self.bin_path, dtype=self.dtype, mode="r") if expected_bytes
                       else np.zeros(0, dtype=self.dtype))

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    @property
    def num_documents(self) -> int:
        return len(self.document_indices) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        start = int(self.sequence_pointers[index]) // np.dtype(self.dtype).itemsize
        return self.tokens[start: start + int(self.sequence_lengths[index])]
