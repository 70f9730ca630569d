"""The external sort on its own: its stream equals `sorted()` of the records for any run size
(one run in RAM, many runs, several merge passes), it never holds more than `run_records`
records, and it leaves no file behind, even when the caller fails mid-way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from data_preprocess.cleaning.external_sort import (
    MAX_FAN_IN,
    MERGE_BLOCK_RECORDS,
    MIN_RUN_RECORDS,
    WORK_DIR_PREFIX,
    ExternalSorter,
    merge_plan,
    remove_leftover_work_dirs,
)


def random_records(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys over the whole uint64 range (above 2^63 too) with many repeats, as buckets have."""
    keys = rng.integers(0, np.iinfo(np.uint64).max, size=count, dtype=np.uint64, endpoint=True)
    keys[rng.random(count) < 0.5] = keys[0]  # one big bucket
    keys[rng.random(count) < 0.2] = np.iinfo(np.uint64).max
    return keys, rng.permutation(count).astype(np.int64)


def sort_externally(keys: np.ndarray, docs: np.ndarray, work_dir: Path, run_records: int,
                    add_size: int = 37) -> tuple[list[tuple[int, int]], ExternalSorter]:
    with ExternalSorter(work_dir, run_records) as sorter:
        for start in range(0, len(keys), add_size):  # added in pieces unrelated to the runs
            sorter.add(keys[start:start + add_size], docs[start:start + add_size])
        return list(sorter.sorted_pairs()), sorter


@pytest.mark.parametrize("run_records", [3, 4, 10, 64, 499, 500, 100_000])
def test_stream_equals_sorted_and_holds_at_most_run_records(tmp_path, run_records):
    keys, docs = random_records(np.random.default_rng(run_records), 500)
    merged, sorter = sort_externally(keys, docs, tmp_path, run_records)
    assert merged == sorted(zip(keys.tolist(), docs.tolist()))
    assert 0 < sorter.peak_records_held <= run_records
    runs_expected = 0 if run_records >= 500 else -(-500 // run_records)
    assert sorter.runs_written >= runs_expected  # merge passes write more
    assert list(tmp_path.iterdir()) == []  # every run file and its folder are gone


def test_many_runs_need_several_merge_passes(tmp_path):
    """With run_records = 3 a merge reads 2 runs: the 334 first runs go down to the 2 of the
    final merge in 8 passes (334 -> 167 -> 84 -> ... -> 3 -> 2), each merge of two runs
    writing one, so 334 - 2 merges write 332 more runs."""
    assert merge_plan(3) == (2, 1)
    keys, docs = random_records(np.random.default_rng(0), 1000)
    merged, sorter = sort_externally(keys, docs, tmp_path, 3)
    assert merged == sorted(zip(keys.tolist(), docs.tolist()))
    assert sorter.runs_written == 334 + 332


@pytest.mark.parametrize("run_records", [3, 4, 5, 100, 2047, 2048, 3 * 2048, 65_536, 10**9])
def test_merge_plan_fits_the_budget(run_records):
    fan_in, block = merge_plan(run_records)
    assert 2 <= fan_in <= MAX_FAN_IN and block >= 1 and (fan_in + 1) * block <= run_records
    if run_records >= 3 * MERGE_BLOCK_RECORDS:  # big budgets read big blocks
        assert block >= MERGE_BLOCK_RECORDS // 2


def test_empty_and_single_run_never_touch_the_disk(tmp_path):
    assert sort_externally(np.empty(0, np.uint64), np.empty(0, np.int64), tmp_path, 3)[0] == []
    keys, docs = random_records(np.random.default_rng(1), 50)
    merged, sorter = sort_externally(keys, docs, tmp_path / "work", 50)
    assert sorter.runs_written == 0 and not (tmp_path / "work").exists()
    assert merged == sorted(zip(keys.tolist(), docs.tolist()))


def test_run_files_are_deleted_when_the_caller_fails(tmp_path):
    keys, docs = random_records(np.random.default_rng(2), 100)
    with pytest.raises(RuntimeError, match="stop"), ExternalSorter(tmp_path, 10) as sorter:
        sorter.add(keys, docs)
        stream = sorter.sorted_pairs()
        next(stream)
        assert len(list(tmp_path.iterdir())) == 1  # the runs exist while it merges
        raise RuntimeError("stop")
    assert list(tmp_path.iterdir()) == []


def test_leftovers_of_a_killed_run_are_removed_and_bad_sizes_refused(tmp_path):
    (tmp_path / f"{WORK_DIR_PREFIX}abc").mkdir()
    (tmp_path / f"{WORK_DIR_PREFIX}abc" / "run000000.bin").write_bytes(b"x" * 16)
    (tmp_path / "a.jsonl.bands.npy").write_bytes(b"")  # not the sorter's: kept
    assert remove_leftover_work_dirs(tmp_path) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["a.jsonl.bands.npy"]
    with pytest.raises(ValueError, match=f"run_records >= {MIN_RUN_RECORDS}"):
        ExternalSorter(tmp_path, MIN_RUN_RECORDS - 1)
    with pytest.raises(ValueError, match="3 keys but 2 documents"):
        ExternalSorter(tmp_path, 10).add(np.zeros(3, np.uint64), np.zeros(2, np.int64))
