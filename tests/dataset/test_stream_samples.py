"""What the stream does not train on as it is gets counted, exactly as the pretokenizers count it.

Reference: the offline pretokenizers (data_preprocess/pretokenize_*.py) run on the same shard;
their reports count empty texts (`skipped.empty`), SFT/DPO samples dropped for length
(`skipped.too_long`) and samples cut to fit (`num_truncated`). The stream's samples of that
shard, read to the end, must count the same; and the loader's running count must match its
exact position (a formula over the record numbers).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from torch.utils.data import default_collate

from data_preprocess.pretokenize_chat import pretokenize_chat_data
from data_preprocess.pretokenize_pretrain_data import pretokenize_pretrain_data
from dataset.stream import StreamDataset, StreamLoader, StreamSettings
from dataset.stream_samples import Position
from dataset.stream_shards import find_sources
from utils.readers import iter_raw_items

SEQ_LEN = 24


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def settings(task: str, tokenizer_dir: Path) -> StreamSettings:
    return StreamSettings(task, str(tokenizer_dir), SEQ_LEN, seed=5, shuffle=False,
                          holdout_every=0)


def shard_counts(task: str, data_dir: Path, tokenizer_dir: Path) -> dict[str, int]:
    """Read the one shard of data_dir to its end; what the samples generator returns."""
    dataset = StreamDataset(find_sources(data_dir), settings(task, tokenizer_dir))
    (shard,) = dataset.sources[0].shards
    samples = dataset.samples(iter_raw_items(shard), Position(0, 0, {}))
    while True:
        try:
            next(samples)
        except StopIteration as end:
            return end.value


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "epsilon"])
                    for _ in range(count))


def test_empty_and_whitespace_only_texts_are_counted(tmp_path, tiny_hf_tokenizer_dir):
    rng = random.Random()
    texts = [words(rng, rng.randint(3, 30)) for _ in range(60)]
    blanks = rng.sample(range(60), rng.randint(3, 8))
    for index in blanks:
        texts[index] = rng.choice(["", " ", "   \n", "\t"])
    write_jsonl(tmp_path / "raw" / "a.jsonl", [{"text": text} for text in texts])
    offline = pretokenize_pretrain_data(tmp_path / "raw", tiny_hf_tokenizer_dir,
                                        tmp_path / "pretok", num_workers=0)
    counts = shard_counts("pretrain", tmp_path / "raw", tiny_hf_tokenizer_dir)
    assert counts["empty"] == offline["skipped"]["empty"] == len(blanks)

    # The loader's count follows its exact position: epochs done, then the current one's
    # blank records before the next record to read (records are numbered from 1).
    dataset = StreamDataset(find_sources(tmp_path / "raw"),
                            settings("pretrain", tiny_hf_tokenizer_dir), 0, 1, 2)
    loader = StreamLoader(dataset, 2, default_collate, num_workers=2, shuffle_buffer=0)
    batches = iter(loader)
    for _ in range(rng.randint(10, 60)):
        next(batches)
    expected = 0
    for worker, state in enumerate(loader.worker_states):  # worker w reads records n % 2 == w
        cursor = state["sources"][0]
        mine = [index for index in blanks if (index + 1) % 2 == worker]
        expected += cursor["epoch"] * len(mine) + sum(index + 1 < cursor["record"]
                                                      for index in mine)
    assert loader.policy_counts()["empty_records_skipped"] == expected


@pytest.mark.parametrize("task", ["sft", "dpo"])
def test_long_chat_records_dropped_and_truncated_are_counted(task, tmp_path,
                                                             tiny_hf_tokenizer_dir):
    rng = random.Random()
    # (prompt words, answer words): fits, is cut (a short prompt leaves answer tokens to
    # train on), is dropped (the prompt alone fills seq_len); each at least once.
    shapes = {"fits": (1, 1), "cut": (1, 40), "dropped": (40, 1)}
    kinds = ["fits", "cut", "dropped"] + rng.choices(list(shapes), k=40)
    records = []
    for kind in kinds:
        prompt, answer = (words(rng, count + rng.randint(0, 3)) for count in shapes[kind])
        records.append({"messages": [{"role": "user", "content": prompt},
                                     {"role": "assistant", "content": answer}]}
                       if task == "sft" else
                       {"prompt": prompt, "chosen": answer, "rejected": words(rng, 2)})
    write_jsonl(tmp_path / "raw" / "a.jsonl", records)
    offline = pretokenize_chat_data(task, tmp_path / "raw", tiny_hf_tokenizer_dir, SEQ_LEN,
                                    out_dir=tmp_path / "pretok", num_workers=0)
    counts = shard_counts(task, tmp_path / "raw", tiny_hf_tokenizer_dir)
    assert offline["skipped"].get("too_long", 0) > 0 and offline["num_truncated"] > 0
    assert counts["too_long"] == offline["skipped"]["too_long"]
    assert counts["cut_to_fit"] == offline["num_truncated"]
