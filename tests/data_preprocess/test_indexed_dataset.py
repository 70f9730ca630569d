"""Megatron MMIDIDX writer/reader: bytes checked by an independent reader written from the spec."""

from __future__ import annotations

import numpy as np
import pytest

from data_preprocess.indexed_dataset import IndexedDataset, IndexedDatasetWriter, token_dtype
from tests.megatron_spec_reader import read_by_spec


def random_documents(rng: np.random.Generator, vocab_size: int, count: int) -> list[list]:
    """Documents of 1-3 sequences, some sequences empty, ids anywhere in the vocabulary."""
    return [[rng.integers(0, vocab_size, size=rng.integers(0, 40)).tolist()
             for _ in range(rng.integers(1, 4))] for _ in range(count)]


@pytest.mark.parametrize("vocab_size", [515, 70000])  # uint16 and int32 files
def test_writer_matches_spec_reader(tmp_path, vocab_size):
    rng = np.random.default_rng()
    documents = random_documents(rng, vocab_size, int(rng.integers(5, 30)))
    dtype = token_dtype(vocab_size)
    with IndexedDatasetWriter(tmp_path / "part", dtype) as writer:
        for document in documents:
            writer.add_document(document)

    expected_sequences = [sequence for document in documents for sequence in document]
    expected_doc_indices = np.cumsum([0] + [len(document) for document in documents])
    spec = read_by_spec(tmp_path / "part")
    assert spec["dtype"] == dtype
    assert [s.tolist() for s in spec["sequences"]] == expected_sequences
    assert spec["document_indices"].tolist() == expected_doc_indices.tolist()

    ours = IndexedDataset(tmp_path / "part")
    assert [ours[i].tolist() for i in range(len(ours))] == expected_sequences
    assert ours.num_documents == len(documents)
    assert ours.tokens.tolist() == [t for sequence in expected_sequences for t in sequence]


def test_fast_path_equals_document_path(tmp_path):
    rng = np.random.default_rng()
    pairs = [[rng.integers(0, 500, size=rng.integers(1, 9)).tolist() for _ in range(2)]
             for _ in range(7)]
    with IndexedDatasetWriter(tmp_path / "slow", np.uint16) as writer:
        for pair in pairs:
            writer.add_document(pair)
    with IndexedDatasetWriter(tmp_path / "fast", np.uint16) as writer:
        flat = np.array([t for pair in pairs for s in pair for t in s], dtype=np.uint16)
        writer.add_tokens(flat, [len(s) for pair in pairs for s in pair])
        writer.end_documents(2)
    for name in ("{}.bin", "{}.idx"):
        slow, fast = tmp_path / name.format("slow"), tmp_path / name.format("fast")
        assert slow.read_bytes() == fast.read_bytes()


def test_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), IndexedDatasetWriter(tmp_path / "x", np.uint16) as writer:
        writer.add_document([[1, 2, 3]])
        raise RuntimeError("crash mid-file")
    assert list(tmp_path.iterdir()) == []


def test_mismatched_pair_is_refused(tmp_path):
    for name, length in (("a", 5), ("b", 6)):
        with IndexedDatasetWriter(tmp_path / name, np.uint16) as writer:
            writer.add_document([list(range(length))])
    (tmp_path / "a.bin").write_bytes((tmp_path / "b.bin").read_bytes())
    with pytest.raises(ValueError, match="a.bin"):
        IndexedDataset(tmp_path / "a")


@pytest.mark.parametrize("damage", ["cut", "extra"])
def test_damaged_index_is_refused(tmp_path, damage):
    """An .idx whose size disagrees with its own header (cut off, or with trailing bytes)."""
    rng = np.random.default_rng()
    with IndexedDatasetWriter(tmp_path / "a", np.uint16) as writer:
        for document in random_documents(rng, 500, 6):
            writer.add_document(document)
    idx = (tmp_path / "a.idx").read_bytes()
    cut = int(rng.integers(1, 9))
    (tmp_path / "a.idx").write_bytes(idx[:-cut] if damage == "cut" else idx + bytes(cut))
    with pytest.raises(ValueError, match="a.idx: .* bytes, but its header promises"):
        IndexedDataset(tmp_path / "a")
