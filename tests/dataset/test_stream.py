"""The streaming dataset (dataset/stream.py) against references.

- Equivalence: unshuffled, the stream yields exactly the windows of the pretokenized `.bin` +
  `.ibin` path on the same corpus (same documents, order, EOS placement).
- Exact resume: iterate k batches -> save -> rebuild -> the next n batches equal those of the
  uninterrupted loader (2 workers, shuffle buffer, two mixed sources; pretrain, SFT, DPO).
- Changed worker count: the resumed stream starts the next epoch, which holds every window once.
- Bad input: a malformed line is an error naming shard and line, or a counted skip; a shard
  that disappears between epochs is an error naming it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import default_collate

from data.toy_corpus import multilingual_corpus
from data_preprocess.build_pretrain_sample_index_map import build_sample_index
from data_preprocess.pretokenize_pretrain_data import pretokenize_pretrain_data
from dataset.dataset_dpo import DPOCollator
from dataset.dataset_pretrain import PretokDatasetWithIndex
from dataset.dataset_sft import SFTCollator
from dataset.stream import StreamDataset, StreamLoader, StreamSettings, holdout_items
from dataset.stream_shards import find_sources, parse_data_mix

SEQ_LEN = 16


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Two sources of raw shards of uneven sizes, with an empty and a whitespace-only text."""
    root = tmp_path_factory.mktemp("stream_corpus")
    texts = multilingual_corpus(240, seed=3)
    texts[5], texts[70] = "", "   \n"
    write_jsonl(root / "web" / "a.jsonl", [{"text": t} for t in texts[:90]])
    write_jsonl(root / "web" / "sub" / "b.jsonl", [{"text": t} for t in texts[90:120]])
    write_jsonl(root / "web" / "c.jsonl", [{"text": t} for t in texts[120:170]])
    write_jsonl(root / "books" / "d.jsonl", [{"text": t} for t in texts[170:]])
    return root


def make_loader(corpus: Path, tokenizer_dir: Path, *, task: str = "pretrain", mix: str = "",
                source: str = "web", num_workers: int = 0, buffer: int = 0,
                shuffle: bool = False, holdout_every: int = 0, batch_size: int = 4,
                rank: int = 0, world_size: int = 1, skip_bad_records: bool = False,
                seq_len: int = SEQ_LEN) -> StreamLoader:
    settings = StreamSettings(task, str(tokenizer_dir), seq_len, seed=7, shuffle=shuffle,
                              holdout_every=holdout_every, skip_bad_records=skip_bad_records)
    data_dir = corpus if mix else corpus / source
    dataset = StreamDataset(find_sources(data_dir, mix), settings, rank, world_size, num_workers)
    collate = {"pretrain": default_collate, "sft": SFTCollator(0, 8, seq_len),
               "dpo": DPOCollator(0, 8, seq_len)}[task]
    return StreamLoader(dataset, batch_size, collate, num_workers, buffer)


def take(batches, count: int) -> list[dict[str, torch.Tensor]]:
    return [next(batches) for _ in range(count)]


def assert_same_batches(left: list[dict], right: list[dict]) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key


def test_unshuffled_stream_equals_the_pretokenized_index(corpus, tmp_path, tiny_hf_tokenizer_dir):
    pretok = tmp_path / "pretok"
    pretokenize_pretrain_data(corpus / "web", tiny_hf_tokenizer_dir, pretok, num_workers=0)
    build_sample_index(pretok, SEQ_LEN, valid_samples=0)
    reference = PretokDatasetWithIndex(pretok, SEQ_LEN, "train")
    assert len(reference) > 50

    stream = iter(make_loader(corpus, tiny_hf_tokenizer_dir, batch_size=1))
    for index in range(len(reference)):  # one whole epoch, sample by sample
        window, expected = next(stream), reference[index]
        assert torch.equal(window["input_ids"][0], expected["input_ids"]), index
        assert torch.equal(window["labels"][0], expected["labels"]), index
    # ... and then the next epoch starts over with the first window
    assert torch.equal(next(stream)["input_ids"][0], reference[0]["input_ids"])


def resume_check(make, first: int, then: int) -> None:
    """iterate `first` batches -> save -> rebuild -> the next `then` equal the uninterrupted."""
    loader = make()
    batches = iter(loader)
    take(batches, first)
    state = loader.state_dict()
    expected = take(batches, then)
    resumed = make()
    resumed.load_state_dict(torch.load(_saved(state), weights_only=True))
    assert_same_batches(take(iter(resumed), then), expected)


def _saved(state: dict) -> io.BytesIO:
    """Through torch.save/load like a checkpoint (weights_only: plain types and tensors)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("first", [3, 11])
def test_resume_mid_epoch_with_two_workers_gives_exactly_the_remaining_samples(
        corpus, tiny_hf_tokenizer_dir, first):
    def make():
        return make_loader(corpus, tiny_hf_tokenizer_dir, mix="web:0.7,books:0.3",
                           num_workers=2, buffer=24, shuffle=True, holdout_every=10)
    resume_check(make, first, then=30)  # 30 x 4 samples: beyond the smaller source's epoch


@pytest.mark.parametrize("task", ["sft", "dpo"])
def test_chat_streams_resume_exactly(tmp_path, tiny_hf_tokenizer_dir, task):
    if task == "sft":
        records = [{"messages": [{"role": "user", "content": f"q{i} " * (i % 5 + 1)},
                                 {"role": "assistant", "content": f"a{i}"}]} for i in range(60)]
    else:
        records = [{"prompt": f"q{i}", "chosen": f"yes {i}", "rejected": f"no {i} " * (i % 4)}
                   for i in range(60)]
    write_jsonl(tmp_path / task / "one.jsonl", records[:25])
    write_jsonl(tmp_path / task / "two.jsonl", records[25:])

    def make():
        return make_loader(tmp_path, tiny_hf_tokenizer_dir, task=task, source=task,
                           num_workers=2, buffer=6, shuffle=True, seq_len=48)
    resume_check(make, first=4, then=20)


def test_a_changed_worker_count_resumes_at_the_next_epoch_without_repeats(
        corpus, tiny_hf_tokenizer_dir):
    reference = [tuple(window.tolist()) for window in _one_epoch(
        make_loader(corpus, tiny_hf_tokenizer_dir, batch_size=1))]
    two_workers = make_loader(corpus, tiny_hf_tokenizer_dir, batch_size=1, num_workers=2)
    batches = iter(two_workers)
    first_run = [tuple(next(batches)["input_ids"][0].tolist()) for _ in range(40)]
    state = two_workers.state_dict()

    one_worker = make_loader(corpus, tiny_hf_tokenizer_dir, batch_size=1)
    with pytest.raises(ValueError, match="another world size or worker count"):
        one_worker.load_state_dict(state)
    one_worker.load_resharded([state])
    resumed = iter(one_worker)
    after = [tuple(next(resumed)["input_ids"][0].tolist()) for _ in range(len(reference))]
    # The next epoch, whole and in order: every window once, none repeated, none skipped in
    # it; what the first run had not reached of its epoch is skipped (the documented bound).
    assert after == reference
    assert set(first_run) <= set(reference) and len(first_run) < len(reference)


def _one_epoch(loader: StreamLoader):
    """The windows of epoch 0 of an unshuffled single-worker loader."""
    for batch in iter(loader):
        if loader.worker_states[0]["sources"][0]["epoch"] > 0:
            return
        yield batch["input_ids"][0]


def test_mixing_follows_the_weights(corpus, tiny_hf_tokenizer_dir):
    assert parse_data_mix("web:0.7, books:0.3") == [("web", 0.7), ("books", 0.3)]
    with pytest.raises(ValueError, match="NAME:WEIGHT"):
        parse_data_mix("web=0.7")
    books = make_loader(corpus, tiny_hf_tokenizer_dir, source="books", batch_size=1)
    books_windows = {tuple(window.tolist()) for window in _one_epoch(books)}
    mixed = iter(make_loader(corpus, tiny_hf_tokenizer_dir, mix="web:0.75,books:0.25",
                             batch_size=1))
    drawn = [tuple(next(mixed)["input_ids"][0].tolist()) for _ in range(800)]
    books_share = sum(window in books_windows for window in drawn) / len(drawn)
    assert books_share == pytest.approx(0.25, abs=0.05)  # 800 draws: sd ~0.015


def test_holdout_records_are_never_trained_on(corpus, tiny_hf_tokenizer_dir):
    loader = make_loader(corpus, tiny_hf_tokenizer_dir, holdout_every=3, batch_size=1)
    valid = holdout_items(loader.dataset, limit=1000)
    train = take(iter(loader), 150)
    valid_tokens = {tuple(item["input_ids"].tolist()) for item in valid}
    assert valid and not valid_tokens & {tuple(b["input_ids"][0].tolist()) for b in train}


def test_a_malformed_record_names_shard_and_line_or_is_counted(tmp_path, tiny_hf_tokenizer_dir):
    shard = write_jsonl(tmp_path / "bad" / "s.jsonl", [{"text": f"doc {i} " * 9}
                                                      for i in range(40)])
    lines = shard.read_text().splitlines(keepends=True)
    lines[6] = '{"text": "unterminated\n'
    shard.write_text("".join(lines))
    with pytest.raises(ValueError, match=r"s\.jsonl:7: malformed_json"):
        take(iter(make_loader(tmp_path, tiny_hf_tokenizer_dir, source="bad")), 30)
    loader = make_loader(tmp_path, tiny_hf_tokenizer_dir, source="bad", skip_bad_records=True)
    take(iter(loader), 30)
    assert loader.skipped_records() >= 1


def test_a_shard_that_disappears_between_epochs_is_named(tmp_path, tiny_hf_tokenizer_dir):
    for name in ("x", "y"):
        write_jsonl(tmp_path / "gone" / f"{name}.jsonl", [{"text": f"{name} {i} " * 9}
                                                          for i in range(20)])
    loader = make_loader(tmp_path, tiny_hf_tokenizer_dir, source="gone", batch_size=1)
    batches = iter(loader)
    next(batches)
    (tmp_path / "gone" / "y.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match=r"y\.jsonl: shard of source 'gone' disappeared"):
        take(batches, 1000)
