"""External merge sort of (band key, document) records: sort more records than fit in RAM
(Knuth, TAOCP vol. 3, §5.4; what `sort(1)` does with a file larger than memory, and the
middle stage of datatrove's four-stage MinHash).

LSH needs each band's records in key order, because a run of equal keys is one bucket
(cleaning/dedup.py). Sorting a band column in RAM costs 24 bytes per document, so a corpus
of a billion documents would need 24 GB for one band. Instead, with a budget of
`run_records` records:

1. Runs: records arrive in any order into a buffer of `run_records`; when it is full, it
   is sorted (by key, then document) and written to a temporary file, a *run*.
2. Merge passes: while there are more runs than one merge may read at once (its fan-in),
   each group of fan-in runs is merged into one longer run (a group of one stays as it is).
3. Final merge: `heapq.merge` streams the last runs' records in order, reading each run a
   block at a time. A band that fits one run never touches the disk: its buffer is sorted
   and streamed from RAM.
RAM holds at most `run_records` records at any moment: the buffer in step 1 (freed before
the merge), then one block per run being read plus one block being written.
`peak_records_held` keeps the most held, so the tests can check that bound.

Worked example, run_records = 3 (fan-in 2, blocks of 1 record; records are (key, document)):
    added   (7,0) (3,1) (7,2) | (1,3) (3,4) (9,5) | (1,6)
    step 1  run0 = (3,1) (7,0) (7,2)    run1 = (1,3) (3,4) (9,5)    run2 = (1,6)
    step 2  3 runs > fan-in 2: run3 = merge(run0, run1) = (1,3) (3,1) (3,4) (7,0) (7,2) (9,5);
            run2 stays
    step 3  merge(run3, run2) = (1,3) (1,6) (3,1) (3,4) (7,0) (7,2) (9,5)  == sorted(added)
The records are equal to `sorted()` of the added ones for any run size: runs only change
where the work happens, never the order (ties in key are broken by document number).

Run files are raw records with no header (16 bytes each, `RECORD`): written and read by the
same sorter within one call, in a directory of its own (`sort-XXXXXXXX` under the caller's
work directory) that `close()` deletes; no other process ever reads them.
"""

from __future__ import annotations

import heapq
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from types import TracebackType

import numpy as np

RECORD = np.dtype([("key", "<u8"), ("doc", "<i8")])  # one band bucket key and its document
BYTES_PER_RECORD_SORTED = RECORD.itemsize + 8  # the record, and its place in the sort order
MERGE_BLOCK_RECORDS = 2048  # smallest read from a run (32 KB): large reads, wide merges
MAX_FAN_IN = 256  # runs open at once: well under the usual limit of 1024 open files
DEFAULT_RUN_RECORDS = 4_000_000  # x 24 bytes: ~96 MB; a band of 4M documents never spills
PYTHON_SLICE_RECORDS = 256  # records turned into Python ints at a time, for heapq to compare
MIN_RUN_RECORDS = 3  # a merge reads a block of each of two runs and writes a third
WORK_DIR_PREFIX = "sort-"

Pair = tuple[int, int]  # (key, document), as Python ints: what heapq.merge compares


def merge_plan(run_records: int) -> tuple[int, int]:
    """(fan_in, block): how many runs one merge reads at once, and how many records of each,
    so that fan_in blocks being read and one being written fit in `run_records`. Examples:
    3 -> (2, 1); 65,536 -> (31, 2,048); 4,000,000 -> (256, 15,564)."""
    fan_in = min(MAX_FAN_IN, max(2, run_records // MERGE_BLOCK_RECORDS - 1))
    return fan_in, max(1, run_records // (fan_in + 1))


def pairs_of(records: np.ndarray) -> Iterator[Pair]:
    """A block of records as (key, document) Python ints, converted a slice at a time: `tolist`
    converts fast, in C, but a pair of Python ints costs ~80 bytes against the record's 16,
    so a whole block at once would hold 5x the block's memory."""
    for start in range(0, len(records), PYTHON_SLICE_RECORDS):
        part = records[start:start + PYTHON_SLICE_RECORDS]
        yield from zip(part["key"].tolist(), part["doc"].tolist())


def blocks_of(pairs: Iterator[Pair], size: int) -> Iterator[np.ndarray]:
    """A stream of (key, document) pairs cut into record blocks of `size` (the last shorter)."""
    while chunk := list(islice(pairs, size)):
        yield np.array(chunk, dtype=RECORD)


def read_run(path: Path, block: int) -> Iterator[Pair]:
    """A run file's records in order, read `block` records at a time."""
    with open(path, "rb") as handle:
        while len(records := np.fromfile(handle, dtype=RECORD, count=block)):
            yield from pairs_of(records)


def merge_runs(runs: list[Path], block: int) -> Iterator[Pair]:
    """One k-way merge, streaming: heapq keeps the current head of each run, so it holds
    one block per run whatever their length."""
    return heapq.merge(*(read_run(path, block) for path in runs))


def remove_leftover_work_dirs(work_dir: Path) -> int:
    """Delete the sort directories that a killed run left in `work_dir` (a normal or failed
    run deletes its own); returns how many. Only call it where no other sort can be running."""
    leftovers = sorted(Path(work_dir).glob(f"{WORK_DIR_PREFIX}*"))
    for leftover in leftovers:
        shutil.rmtree(leftover, ignore_errors=True)
    return len(leftovers)


class ExternalSorter:
    """`add` records, then iterate `sorted_pairs()` once; use it as a context manager so its
    run files are deleted whatever happens.

        with ExternalSorter(work_dir, run_records=4_000_000) as sorter:
            sorter.add(keys, docs)          # as many times as needed, any order
            for key, doc in sorter.sorted_pairs(): ...
    """

    def __init__(self, work_dir: Path, run_records: int) -> None:
        if run_records < MIN_RUN_RECORDS:
            raise ValueError(f"an external sort needs run_records >= {MIN_RUN_RECORDS} (a merge "
                             f"holds a block of two runs and one being written); got {run_records}")
        self.work_dir = Path(work_dir)
        self.run_records = run_records
        self.fan_in, self.block = merge_plan(run_records)
        # The buffer: two plain arrays, not one of RECORD, because np.lexsort copies strided
        # columns (+16 bytes per record); allocated at the first add.
        self.keys: np.ndarray | None = None
        self.docs: np.ndarray | None = None
        self.buffered = 0
        self.runs: list[Path] = []
        self.run_dir: Path | None = None  # created at the first spill
        self.runs_written = 0
        self.peak_records_held = 0

    def __enter__(self) -> ExternalSorter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Free the buffer and delete every run file (and their directory)."""
        self._free_buffer()
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir, self.runs = None, []

    def _free_buffer(self) -> None:
        self.keys, self.docs, self.buffered = None, None, 0

    def _hold(self, records: int) -> None:
        self.peak_records_held = max(self.peak_records_held, records)

    def add(self, keys: np.ndarray, docs: np.ndarray) -> None:
        """Buffer records (keys[i], docs[i]); a full buffer becomes a run on disk (step 1)."""
        if len(keys) != len(docs):
            raise ValueError(f"{len(keys)} keys but {len(docs)} documents")
        if self.keys is None:  # np.empty: pages cost RAM only once written
            self.keys = np.empty(self.run_records, dtype=np.uint64)
            self.docs = np.empty(self.run_records, dtype=np.int64)
        start = 0
        while start < len(keys):
            if self.buffered == self.run_records:  # full, and more to come
                self._write_run(self._buffer_in_order())
                self.buffered = 0
            taken = min(len(keys) - start, self.run_records - self.buffered)
            window = slice(self.buffered, self.buffered + taken)
            self.keys[window] = keys[start:start + taken]
            self.docs[window] = docs[start:start + taken]
            self.buffered += taken
            start += taken
            self._hold(self.buffered)

    def _buffer_in_order(self) -> Iterator[np.ndarray]:
        """The buffered records sorted by (key, document), as blocks of records."""
        if self.keys is None or self.docs is None:  # nothing was added
            return
        keys, docs = self.keys[:self.buffered], self.docs[:self.buffered]
        order = np.lexsort((docs, keys))  # the last array given is the primary key
        for start in range(0, len(order), MERGE_BLOCK_RECORDS):
            chosen = order[start:start + MERGE_BLOCK_RECORDS]
            block = np.empty(len(chosen), dtype=RECORD)
            block["key"], block["doc"] = keys[chosen], docs[chosen]
            yield block

    def _write_run(self, blocks: Iterable[np.ndarray]) -> None:
        """Write sorted blocks as the next run file."""
        if self.run_dir is None:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            self.run_dir = Path(tempfile.mkdtemp(prefix=WORK_DIR_PREFIX, dir=self.work_dir))
        path = self.run_dir / f"run{self.runs_written:06d}.bin"
        with open(path, "wb") as handle:
            for block in blocks:
                block.tofile(handle)
        self.runs.append(path)
        self.runs_written += 1

    def _merge_pass(self) -> None:
        """Step 2 once: every group of fan-in runs becomes one run, written in blocks."""
        self._hold((self.fan_in + 1) * self.block)
        groups = [self.runs[i:i + self.fan_in] for i in range(0, len(self.runs), self.fan_in)]
        self.runs = []
        for group in groups:
            if len(group) == 1:
                self.runs.append(group[0])
                continue
            self._write_run(blocks_of(merge_runs(group, self.block), self.block))
            for path in group:
                path.unlink()

    def sorted_pairs(self) -> Iterator[Pair]:
        """Every added record as (key, document), in order (steps 2 and 3); call once."""
        if not self.runs:  # it all fitted in one run: sort in RAM, no files
            for block in self._buffer_in_order():
                yield from pairs_of(block)
            return
        if self.buffered:
            self._write_run(self._buffer_in_order())
        self._free_buffer()  # the merge's blocks take the buffer's place
        while len(self.runs) > self.fan_in:
            self._merge_pass()
        self._hold(len(self.runs) * self.block)
        yield from merge_runs(self.runs, self.block)
