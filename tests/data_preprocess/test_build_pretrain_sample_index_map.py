"""Pretraining sample index (.ibin): tiling, train/valid split, pinning of the token files."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

import data_preprocess.build_pretrain_sample_index_map as sample_index
from data_preprocess.indexed_dataset import IndexedDatasetWriter
from dataset.dataset_pretrain import PretokDatasetWithIndex


def write_token_files(directory, rng, num_files=3) -> dict[str, np.ndarray]:
    """Random token files (one shorter than a sample); returns each file's stream."""
    streams = {}
    for number in range(num_files):
        name = f"part{number}" if number else "sub/part0"
        num_docs = rng.integers(5, 12) if number else 1  # sub/part0: shorter than any sample
        docs = [rng.integers(0, 60000, size=rng.integers(1, 30) if number else 1)
                for _ in range(num_docs)]
        with IndexedDatasetWriter(directory / name, np.uint16) as writer:
            for doc in docs:
                writer.add_document([doc])
        streams[f"{name}.bin"] = np.concatenate(docs).astype(np.int64)
    return streams


def read_pairs(path) -> np.ndarray:
    """Independent .ibin reader from design.md §2.5: little-endian int64 (file, offset) pairs."""
    return np.frombuffer(path.read_bytes(), dtype="<i8").reshape(-1, 2)


def test_tiling_split_and_items(tmp_path, monkeypatch):
    rng = np.random.default_rng()
    streams = write_token_files(tmp_path, rng)
    seq_len = int(rng.integers(2, 9))
    monkeypatch.setattr(sample_index, "CHUNK_SLOTS", 5)  # exercise the chunked path
    counts = sample_index.build_sample_index(tmp_path, seq_len, valid_samples=3, seed=7)

    sidecar = json.loads((tmp_path / f"train_L{seq_len}.ibin.json").read_text())
    paths = [entry["path"] for entry in sidecar["files"]]
    assert paths == sorted(streams)
    # Expected slots from the documented rule: stride L, L+1 tokens each, inside one file.
    expected = {(f, k * seq_len) for f, p in enumerate(paths)
                for k in range(max(len(streams[p]) - 1, 0) // seq_len)}
    train = read_pairs(tmp_path / f"train_L{seq_len}.ibin")
    valid = read_pairs(tmp_path / f"valid_L{seq_len}.ibin")
    train_set, valid_set = set(map(tuple, train.tolist())), set(map(tuple, valid.tolist()))
    assert len(valid_set) == 3 and not train_set & valid_set
    assert train_set | valid_set == expected
    assert len(train) == len(train_set) == counts["train"]  # no duplicates
    assert train.tolist() == sorted(train.tolist())  # stream order; the sampler shuffles

    dataset = PretokDatasetWithIndex(tmp_path, seq_len, "valid")
    for i, (file_index, offset) in enumerate(valid.tolist()):
        window = streams[paths[file_index]][offset: offset + seq_len + 1]
        assert len(window) == seq_len + 1
        assert dataset[i]["input_ids"].tolist() == window[:-1].tolist()
        assert dataset[i]["labels"].tolist() == window[1:].tolist()
        assert dataset[i]["input_ids"].dtype == dataset[i]["labels"].dtype == torch.int64


def test_deterministic_and_seeded(tmp_path):
    write_token_files(tmp_path, np.random.default_rng(1))
    sample_index.build_sample_index(tmp_path, 3, valid_samples=4, seed=1)
    first = (tmp_path / "valid_L3.ibin").read_bytes(), (tmp_path / "train_L3.ibin").read_bytes()
    sample_index.build_sample_index(tmp_path, 3, valid_samples=4, seed=1)
    assert first == ((tmp_path / "valid_L3.ibin").read_bytes(),
                     (tmp_path / "train_L3.ibin").read_bytes())
    sample_index.build_sample_index(tmp_path, 3, valid_samples=4, seed=2)
    assert first[0] != (tmp_path / "valid_L3.ibin").read_bytes()


@pytest.mark.parametrize("change", ["rewritten", "added", "removed"])
def test_changed_token_files_are_refused(tmp_path, change):
    rng = np.random.default_rng()
    write_token_files(tmp_path, rng)
    sample_index.build_sample_index(tmp_path, 2, valid_samples=1)
    PretokDatasetWithIndex(tmp_path, 2, "train")  # loads while nothing changed
    victim = "part1"
    if change == "removed":
        (tmp_path / f"{victim}.bin").unlink()
        (tmp_path / f"{victim}.idx").unlink()
    else:
        victim = "part1" if change == "rewritten" else "extra"
        with IndexedDatasetWriter(tmp_path / victim, np.uint16) as writer:
            writer.add_document([rng.integers(0, 100, size=77)])
    with pytest.raises(ValueError, match=f"{victim}.bin"):
        PretokDatasetWithIndex(tmp_path, 2, "train")


def test_pickling_does_not_copy_the_maps(tmp_path):
    """DataLoader workers receive the dataset pickled: it must carry paths, not token arrays."""
    write_token_files(tmp_path, np.random.default_rng(), num_files=2)
    sample_index.build_sample_index(tmp_path, 2, valid_samples=1)
    dataset = PretokDatasetWithIndex(tmp_path, 2, "train")
    first = dataset[0]["input_ids"].tolist()  # opens the maps in this process
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone._maps is None and clone[0]["input_ids"].tolist() == first


def test_interrupted_rebuild_leaves_no_usable_half(tmp_path, monkeypatch):
    """A rebuild (here with another seed) killed between the two splits: the old valid split
    (drawn with the old seed, so overlapping the new train split) must no longer load, nor
    count as done for dataset/build.py."""
    write_token_files(tmp_path, np.random.default_rng())
    sample_index.build_sample_index(tmp_path, 2, valid_samples=2, seed=1)
    real_write_index = sample_index.write_index

    def crash_before_valid(path, chunks, sidecar):
        if sidecar["split"] == "valid":
            raise KeyboardInterrupt("killed between the splits")
        return real_write_index(path, chunks, sidecar)

    monkeypatch.setattr(sample_index, "write_index", crash_before_valid)
    with pytest.raises(KeyboardInterrupt):
        sample_index.build_sample_index(tmp_path, 2, valid_samples=2, seed=2)
    assert not (tmp_path / "valid_L2.ibin.json").exists()  # what dataset/build.py waits for
    with pytest.raises(FileNotFoundError):
        PretokDatasetWithIndex(tmp_path, 2, "valid")  # the old seed-1 split is no longer valid
    assert json.loads((tmp_path / "train_L2.ibin.json").read_text())["seed"] == 2
