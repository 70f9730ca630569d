"""SFT/DPO pretokenization: stored ids + masks, labels, truncation policy, bad records, collate."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pytest
import torch

from data_preprocess.pretokenize_chat import pretokenize_chat_data
from dataset.chat_store import ChatTokenStore
from dataset.dataset_dpo import DPOCollator, DPODataset
from dataset.dataset_sft import SFTCollator, SupervisedDataset
from tests.hf_cache_helpers import parquet_bytes, put_dataset_in_hf_cache, use_offline_hf_cache
from tests.megatron_spec_reader import read_by_spec
from tokenizer import load_tokenizer
from utils.conversation import render_conversation
from utils.readers import BadRecordError

WORDS = ["hello", "数据", "😀", "model", "<|im_end|>", "<|endoftext|>", "x=1", "naïve", "\n"]


def text(rng: random.Random, low: int = 1, high: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def sft_records(rng: random.Random, count: int) -> list[tuple[dict, list[dict]]]:
    """(record in a random one of the three shapes, the conversation it means)."""
    out = []
    for _ in range(count):
        user, reply = text(rng), text(rng, 1, rng.choice([3, 40]))
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        shape = rng.choice(["sharegpt", "openai", "alpaca"])
        if shape == "sharegpt":
            record = {"conversations": [{"from": "human", "value": user},
                                        {"from": "gpt", "value": reply}]}
        elif shape == "openai":
            record = {"messages": messages}
        else:
            record = {"instruction": user, "input": "", "output": reply}
        out.append((record, messages))
    return out


def write_jsonl(path, records) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def trained_text(tokenizer, item: dict, prefix: str = "") -> list[str]:
    """Decode the label runs (labels != -100) of one item: what the loss trains on."""
    labels = item[prefix + "labels"].tolist()
    runs, current = [], []
    for label in labels:
        if label != -100:
            current.append(label)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    return runs + ([tokenizer.decode(current)] if current else [])


def test_sft_store_labels_and_truncation(tmp_path, tiny_hf_tokenizer_dir):
    rng = random.Random()
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    pairs = sft_records(rng, 30)
    write_jsonl(tmp_path / "raw/train.jsonl", [record for record, _ in pairs])
    max_seq_len = 48
    report = pretokenize_chat_data("sft", tmp_path / "raw", tiny_hf_tokenizer_dir, max_seq_len,
                                   tmp_path / "out", num_workers=2, batch_size=4)

    references = [render_conversation(tokenizer, messages) for _, messages in pairs]
    kept = [(ids, mask, messages) for (ids, mask), (_, messages) in zip(references, pairs)
            if any(mask[1:max_seq_len])]
    assert report["skipped"] == ({"too_long": len(pairs) - len(kept)} if len(kept) < len(pairs)
                                 else {})
    assert report["num_truncated"] == sum(len(ids) > max_seq_len for ids, _, _ in kept)
    ids_file = read_by_spec(tmp_path / "out/train")
    mask_file = read_by_spec(tmp_path / "out/train.mask")
    assert [s.tolist() for s in ids_file["sequences"]] == [ids[:max_seq_len] for ids, _, _ in kept]
    assert [s.tolist() for s in mask_file["sequences"]] == [m[:max_seq_len] for _, m, _ in kept]

    dataset = SupervisedDataset(tmp_path / "out")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for index, (ids, _, messages) in enumerate(kept):
        item = dataset[index]
        assert item["input_ids"].tolist() == ids[:max_seq_len]
        reply = messages[1]["content"]
        trained_ids = [label for label in item["labels"].tolist() if label != -100]
        full_ids = tokenizer.encode(reply, add_special_tokens=False) + [im_end]
        if len(ids) <= max_seq_len:
            assert trained_text(tokenizer, item) == [reply + "<|im_end|>"]
            assert trained_ids == full_ids
        else:  # cut from the end: a prefix of the reply survives, the prompt is untouched
            assert 0 < len(trained_ids) <= len(full_ids)  # maybe only "\n" was cut
            assert trained_ids == full_ids[: len(trained_ids)]


def test_sft_truncation_keeps_the_system_prompt_and_cuts_the_reply(tmp_path,
                                                                   tiny_hf_tokenizer_dir):
    """Reference: the ChatML text written out by hand; a stored sample decodes to a prefix of
    it that still holds the system and user turns whole (only the reply's end is cut)."""
    rng = random.Random()
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    system, max_seq_len = "Answer briefly.", 64
    replies = [" ".join(rng.choice(["model", "data", "x=1", "hello"]) for _ in range(60))
               for _ in range(6)]
    write_jsonl(tmp_path / "raw/train.jsonl", [
        {"messages": [{"role": "user", "content": f"question {i}"},
                      {"role": "assistant", "content": reply}]} for i, reply in enumerate(replies)])
    report = pretokenize_chat_data("sft", tmp_path / "raw", tiny_hf_tokenizer_dir, max_seq_len,
                                   tmp_path / "out", system_prompt=system, num_workers=1)
    assert report["num_truncated"] == report["num_documents"] == len(replies)
    stored = read_by_spec(tmp_path / "out/train")["sequences"]
    for i, (ids, reply) in enumerate(zip(stored, replies)):
        prompt = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nquestion {i}"
                  "<|im_end|>\n<|im_start|>assistant\n")
        decoded = tokenizer.decode(ids.tolist())
        assert len(ids) == max_seq_len and decoded.startswith(prompt)
        assert (prompt + reply + "<|im_end|>\n").startswith(decoded) and decoded != prompt


def test_sft_bad_records(tmp_path, tiny_hf_tokenizer_dir):
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    bad = {"conversations": [{"from": "human", "value": "no reply"}]}
    write_jsonl(tmp_path / "raw/a.jsonl", [good, good, bad, good])
    with pytest.raises(BadRecordError, match="a.jsonl:3: no_assistant_turn"):
        pretokenize_chat_data("sft", tmp_path / "raw", tiny_hf_tokenizer_dir, 64,
                              tmp_path / "out", num_workers=1)
    report = pretokenize_chat_data("sft", tmp_path / "raw", tiny_hf_tokenizer_dir, 64,
                                   tmp_path / "out", num_workers=1, skip_bad_records=True)
    assert report["skipped"] == {"no_assistant_turn": 1} and report["num_documents"] == 3


def test_dpo_pairs(tmp_path, tiny_sp_tokenizer_dir):
    rng = random.Random()
    tokenizer = load_tokenizer(tiny_sp_tokenizer_dir)
    records, expected = [], []
    for number in range(12):
        prompt, chosen, rejected = text(rng), text(rng), text(rng)
        if number % 2:
            records.append({"conversations": [{"from": "human", "value": prompt}],
                            "chosen": {"from": "gpt", "value": chosen},
                            "rejected": {"from": "gpt", "value": rejected}})
        else:
            records.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
        expected.append((prompt, chosen, rejected))
    write_jsonl(tmp_path / "raw/pairs.jsonl", records)
    pretokenize_chat_data("dpo", tmp_path / "raw", tiny_sp_tokenizer_dir, 512, tmp_path / "out",
                          num_workers=1)
    spec = read_by_spec(tmp_path / "out/pairs")
    assert spec["document_indices"].tolist() == list(range(0, 2 * len(records) + 1, 2))

    dataset = DPODataset(tmp_path / "out")
    for index, (prompt, chosen, rejected) in enumerate(expected):
        item = dataset[index]
        user = [{"role": "user", "content": prompt}]
        for side, reply in (("chosen_", chosen), ("rejected_", rejected)):
            ids, _ = render_conversation(tokenizer, [*user, {"role": "assistant",
                                                             "content": reply}])
            assert item[side + "input_ids"].tolist() == ids
            assert trained_text(tokenizer, item, side) == [reply + "<|im_end|>"]
        # Both sides start with the same prompt tokens.
        prompt_ids = render_conversation(tokenizer, user)[0]
        for side in ("chosen_", "rejected_"):
            assert item[side + "input_ids"][: len(prompt_ids)].tolist() == prompt_ids


def test_collators_pad_and_mask():
    rng = np.random.default_rng()
    lengths = rng.integers(3, 30, size=5)
    items = []
    for length in lengths:
        ids = torch.from_numpy(rng.integers(0, 500, size=length))
        labels = torch.where(torch.rand(length) < 0.5, ids, -100)
        items.append({"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)})
    batch = SFTCollator(pad_token_id=509, pad_to_multiple_of=8)(items)
    width = int(-(-lengths.max() // 8) * 8)
    assert batch["input_ids"].shape == (5, width)
    for row, (item, length) in enumerate(zip(items, lengths)):
        assert torch.equal(batch["input_ids"][row, :length], item["input_ids"])
        assert torch.equal(batch["labels"][row, :length], item["labels"])
        assert (batch["input_ids"][row, length:] == 509).all()
        assert (batch["labels"][row, length:] == -100).all()
        assert batch["attention_mask"][row].tolist() == [1] * length + [0] * (width - length)
    capped = SFTCollator(pad_token_id=509, pad_to_multiple_of=8, max_seq_len=int(lengths.max()))
    assert capped(items)["input_ids"].shape[1] == lengths.max()

    pairs = [{f"{side}{key}": value for side, item in (("chosen_", a), ("rejected_", b))
              for key, value in item.items()} for a, b in zip(items, reversed(items))]
    dpo_batch = DPOCollator(pad_token_id=509, pad_to_multiple_of=1)(pairs)
    assert dpo_batch["chosen_input_ids"].shape == dpo_batch["rejected_input_ids"].shape \
        == (5, lengths.max())
    for row, pair in enumerate(pairs):  # both sides padded to one width, each with its own item
        for side in ("chosen_", "rejected_"):
            length = len(pair[side + "input_ids"])
            for key, pad in (("input_ids", 509), ("labels", -100), ("attention_mask", 0)):
                padded = dpo_batch[side + key][row]
                assert torch.equal(padded[:length], pair[side + key])
                assert (padded[length:] == pad).all()


def test_dpo_truncation_policy(tmp_path, tiny_hf_tokenizer_dir):
    rng = random.Random()
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    max_seq_len = 40
    records = [{"prompt": text(rng, 1, 30), "chosen": text(rng, 1, 30),
                "rejected": text(rng, 1, 30)} for _ in range(30)]
    write_jsonl(tmp_path / "raw/pairs.jsonl", records)
    report = pretokenize_chat_data("dpo", tmp_path / "raw", tiny_hf_tokenizer_dir, max_seq_len,
                                   tmp_path / "out", num_workers=1)
    kept, dropped, truncated = [], 0, 0
    for record in records:  # the documented policy, applied by hand
        user = [{"role": "user", "content": record["prompt"]}]
        sides = [render_conversation(tokenizer, [*user, {"role": "assistant", "content": reply}])
                 for reply in (record["chosen"], record["rejected"])]
        if all(any(mask[1:max_seq_len]) for _, mask in sides):
            kept.append([ids[:max_seq_len] for ids, _ in sides])
            truncated += any(len(ids) > max_seq_len for ids, _ in sides)
        else:
            dropped += 1
    assert report["num_documents"] == len(kept) and report["num_truncated"] == truncated
    assert report["skipped"] == ({"too_long": dropped} if dropped else {})
    dataset = DPODataset(tmp_path / "out")
    for index, (chosen, rejected) in enumerate(kept):
        assert dataset[index]["chosen_input_ids"].tolist() == chosen
        assert dataset[index]["rejected_input_ids"].tolist() == rejected
    with pytest.raises(ValueError, match="longer than max_seq_len=32"):
        DPODataset(ChatTokenStore(tmp_path / "out", "dpo", max_seq_len=32))


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_a_hub_dataset_id_gives_the_bytes_of_the_same_records(kind, tmp_path, monkeypatch,
                                                              tiny_hf_tokenizer_dir):
    """SFT/DPO records of a Hub dataset (`train` split, .jsonl and .parquet files) render to the
    bytes of the same records in a local folder."""
    rng = random.Random()
    if kind == "sft":
        records = [record for record, _ in sft_records(rng, 8)]
    else:
        records = [{"prompt": text(rng), "chosen": text(rng), "rejected": text(rng)}
                   for _ in range(8)]
    first, second = records[:4], records[4:]
    write_jsonl(tmp_path / "local/a.jsonl", first)
    write_jsonl(tmp_path / "local/b.jsonl", second)
    hub_cache = use_offline_hf_cache(tmp_path / "hf_home", monkeypatch)
    as_jsonl = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in first)
    parquet = parquet_bytes(pa.Table.from_pylist(second)) if kind == "dpo" else \
        "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in second)
    put_dataset_in_hf_cache(hub_cache, f"org/{kind}", {
        "train/a.jsonl": as_jsonl, f"train/b.{'parquet' if kind == 'dpo' else 'jsonl'}": parquet,
        "test/c.jsonl": as_jsonl})
    for source, out in ((f"hf:org/{kind}", "out_hub"), (tmp_path / "local", "out_local")):
        pretokenize_chat_data(kind, source, tiny_hf_tokenizer_dir, 256, tmp_path / out,
                              num_workers=0)
    for name in ("a", "b"):
        for suffix in (".bin", ".idx"):
            assert (tmp_path / "out_hub/train" / name).with_suffix(suffix).read_bytes() == \
                (tmp_path / "out_local" / name).with_suffix(suffix).read_bytes()
    assert not (tmp_path / "out_hub/test").exists()
