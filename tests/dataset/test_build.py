"""build_datasets: splits, the online cache, rank-0 preparation, disjoint samples per rank, and
located errors for damaged store files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from data_preprocess.indexed_dataset import IndexedDatasetWriter
from data_preprocess.pretokenize_pretrain_data import pretokenize_pretrain_data
from dataset.build import build_datasets
from dataset.chat_store import CACHE_DIR_NAME, ChatTokenStore, Complement
from dataset.prepare import prepare_once
from dataset.sampler import StatefulDistributedSampler
from parallel.local_ranks import run_on_ranks
from tokenizer import load_tokenizer


def write_sft(path: Path, tag: str, count: int) -> None:
    """Records whose user text names the file and the record, so every sample is unique."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng()
    lines = [{"messages": [{"role": "user", "content": f"{tag} {i} {rng.integers(1000)}"},
                           {"role": "assistant", "content": f"reply {i}"}]} for i in range(count)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def sample_keys(dataset) -> list[tuple[int, ...]]:
    return [tuple(dataset[i]["input_ids"].tolist()) for i in range(len(dataset))]


def test_complement_equals_set_difference():
    rng = np.random.default_rng()
    total = int(rng.integers(1, 200))
    excluded = np.sort(rng.choice(total, size=int(rng.integers(0, total)), replace=False))
    kept = Complement(excluded, total)
    assert [kept[p] for p in range(len(kept))] == sorted(set(range(total)) - set(excluded.tolist()))
    with pytest.raises(IndexError):
        kept[len(kept)]


def test_valid_files_and_cache_reuse(tmp_path, tiny_hf_tokenizer_dir):
    raw = tmp_path / "raw"
    write_sft(raw / "train.jsonl", "train", 12)
    write_sft(raw / "valid.jsonl", "valid", 5)
    train, valid, _ = build_datasets("sft", raw, load_tokenizer(tiny_hf_tokenizer_dir),
                                     64, num_workers=1)
    assert (len(train), len(valid)) == (12, 5)
    caches = list((raw / CACHE_DIR_NAME).iterdir())
    done_time = (caches[0] / "DONE.json").stat().st_mtime_ns
    again, _, _ = build_datasets("sft", raw, load_tokenizer(tiny_hf_tokenizer_dir),
                                 64, num_workers=1)
    assert sample_keys(again) == sample_keys(train)
    assert list((raw / CACHE_DIR_NAME).iterdir()) == caches  # reused, not rebuilt
    assert (caches[0] / "DONE.json").stat().st_mtime_ns == done_time
    write_sft(raw / "train.jsonl", "changed", 7)  # changed data -> a new cache
    changed, _, _ = build_datasets("sft", raw, load_tokenizer(tiny_hf_tokenizer_dir),
                                   64, num_workers=1)
    assert len(changed) == 7 and len(list((raw / CACHE_DIR_NAME).iterdir())) == 2


def test_seeded_fraction_split_is_disjoint_and_complete(tmp_path, tiny_hf_tokenizer_dir):
    raw = tmp_path / "raw"
    write_sft(raw / "data.jsonl", "only", 40)
    splits = {}
    for seed in (1, 1, 2):
        train, valid, _ = build_datasets("sft", raw, load_tokenizer(tiny_hf_tokenizer_dir),
                                         64, seed=seed,
                                         valid_ratio=0.1, num_workers=1)
        train_keys, valid_keys = set(sample_keys(train)), set(sample_keys(valid))
        assert len(valid_keys) == 4 and not train_keys & valid_keys
        assert len(train_keys | valid_keys) == 40
        splits.setdefault(seed, []).append(valid_keys)
    assert splits[1][0] == splits[1][1] and splits[1][0] != splits[2][0]
    train, valid, _ = build_datasets("sft", raw, load_tokenizer(tiny_hf_tokenizer_dir),
                                     64, valid_ratio=0.0,
                                     num_workers=1)
    assert (len(train), len(valid)) == (40, 0)  # ratio 0: no validation samples at all


def test_pretrain_builds_index_and_refuses_other_tokenizer(tmp_path, tiny_hf_tokenizer_dir,
                                                          tiny_sp_tokenizer_dir):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw/a.jsonl").write_text("".join(
        json.dumps({"text": f"document number {i} of the test corpus"}) + "\n" for i in range(40)))
    pretokenize_pretrain_data(tmp_path / "raw", tiny_hf_tokenizer_dir, tmp_path / "tok",
                              num_workers=1)
    train, valid, collate = build_datasets("pretrain", tmp_path / "tok",
                                           load_tokenizer(tiny_hf_tokenizer_dir), 16)
    batch = collate([train[0], train[1]])
    assert batch["input_ids"].shape == batch["labels"].shape == (2, 16) and len(valid) >= 1
    with pytest.raises(ValueError, match="a.json"):
        build_datasets("pretrain", tmp_path / "tok", load_tokenizer(tiny_sp_tokenizer_dir), 16)


def test_waiting_rank_times_out_on_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")

    def never_called() -> None:
        raise AssertionError("only rank 0 builds")

    with pytest.raises(TimeoutError, match="rank 1"):
        prepare_once(tmp_path / "DONE", never_called, "test data", timeout_s=0.3)


def build_and_sample(rank: int, world_size: int, raw: str, tokenizer_dir: str) -> dict:
    train, _, _ = build_datasets("sft", raw, load_tokenizer(tokenizer_dir), 64, num_workers=1)
    sampler = iter(StatefulDistributedSampler(len(train), rank, world_size, seed=3))
    indices = [next(sampler) for _ in range(6)]
    return {"caches": sorted(os.listdir(Path(raw) / CACHE_DIR_NAME)), "indices": indices,
            "num_samples": len(train), "samples": [sample_keys_at(train, i) for i in indices]}


def sample_keys_at(dataset, index: int) -> tuple[int, ...]:
    return tuple(dataset[index]["input_ids"].tolist())


def test_two_ranks_share_one_cache_and_see_disjoint_samples(tmp_path, tiny_hf_tokenizer_dir):
    raw = tmp_path / "raw"
    write_sft(raw / "data.jsonl", "rank test", 30)
    results = run_on_ranks(build_and_sample, str(raw), str(tiny_hf_tokenizer_dir), world_size=2,
                           timeout=240)
    assert results[0]["caches"] == results[1]["caches"] and len(results[0]["caches"]) == 1
    train, _, _ = build_datasets("sft", raw, load_tokenizer(tiny_hf_tokenizer_dir),
                                 64, num_workers=1)
    stream = np.random.default_rng([3, 0]).permutation(len(train))[:12].tolist()  # design.md §3
    for step in range(6):  # global batch of step k = stream positions 2k, 2k+1
        batch = [results[0]["indices"][step], results[1]["indices"][step]]
        assert batch == stream[2 * step: 2 * step + 2]
    all_indices = results[0]["indices"] + results[1]["indices"]
    assert len(set(all_indices)) == 12  # disjoint across ranks and steps within the epoch
    for result in results:  # every rank reads the same bytes for the same index
        assert result["samples"] == [sample_keys_at(train, i) for i in result["indices"]]


def test_a_damaged_sidecar_is_named(tmp_path):
    with IndexedDatasetWriter(tmp_path / "a", np.uint16) as writer:
        writer.add_document([np.random.default_rng().integers(0, 500, size=9)])
    (tmp_path / "a.json").write_text('{"format": "z2all-sft", "tokenizer": ')  # cut off
    with pytest.raises(ValueError, match=r"a.json: not valid JSON .* beside the token file a.idx"):
        ChatTokenStore(tmp_path, "sft")
