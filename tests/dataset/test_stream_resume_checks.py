"""A resume refuses stream states that would silently mean something else (dataset/stream.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from torch.utils.data import default_collate

from dataset.stream import StreamDataset, StreamLoader, StreamSettings
from dataset.stream_shards import find_sources


def loader_of(root: Path, mix: str, tokenizer_dir: Path) -> StreamLoader:
    settings = StreamSettings("pretrain", str(tokenizer_dir), 8, seed=3, holdout_every=0)
    return StreamLoader(StreamDataset(find_sources(root, mix), settings), 2, default_collate)


def test_reordered_sources_with_the_same_shard_names_are_refused(tmp_path,
                                                                 tiny_hf_tokenizer_dir):
    rng = random.Random()
    for source in ("web", "books"):  # the same shard names in both sources
        (tmp_path / source).mkdir()
        (tmp_path / source / "a.jsonl").write_text("".join(
            json.dumps({"text": f"{source} {rng.random()} " * 5}) + "\n" for _ in range(30)))
    first = loader_of(tmp_path, "web:0.5,books:0.5", tiny_hf_tokenizer_dir)
    batches = iter(first)
    for _ in range(rng.randint(1, 5)):
        next(batches)
    state = first.state_dict()
    expected = [next(batches) for _ in range(3)]

    swapped = loader_of(tmp_path, "books:0.5,web:0.5", tiny_hf_tokenizer_dir)
    with pytest.raises(ValueError, match="--data_mix sources are books, web, but the checkpoint "
                                         "was written with web, books"):
        swapped.restore([state])
    same = loader_of(tmp_path, "web:0.5,books:0.5", tiny_hf_tokenizer_dir)
    assert same.restore([state]) is None
    resumed = iter(same)
    for want in expected:  # the reference: the uninterrupted loader
        got = next(resumed)
        assert all(torch.equal(got[key], want[key]) for key in want)
