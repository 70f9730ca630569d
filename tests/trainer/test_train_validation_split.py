"""The trainer evaluates on the data's own `validation` (else `test`) split when it has one, a
DatasetDict saved to disk, a Hub dataset, files named by split (`DIR@train`), and says at
start how many validation samples it holds and from where; data with no such split holds out
part of train, and says so."""

from __future__ import annotations

import json
import re

import pytest

from dataset.build import build_datasets
from tests.hf_cache_helpers import put_dataset_in_hf_cache, use_offline_hf_cache
from tests.train_helpers import TINY_ARGS, run_main
from tokenizer import load_tokenizer


def chat(question: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": question},
                         {"role": "assistant", "content": answer}]}


TRAIN = [chat(f"What is {n} + 1?", str(n + 1)) for n in range(10)]
VALIDATION = [chat(f"What is {n} + 2?", str(n + 2)) for n in range(3)]
STORY = "Once upon a time a small model learned to count: one, two, three, four, five. " * 6


def jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def dataset_dict(tmp_path, monkeypatch, records: dict[str, list[dict]]) -> str:
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "my_dict"
    datasets.DatasetDict({split: datasets.Dataset.from_list(rows)
                          for split, rows in records.items()}).save_to_disk(str(folder))
    return str(folder)


def hub_dataset(tmp_path, monkeypatch, records: dict[str, list[dict]]) -> str:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user_cache"))  # online SFT's cache
    cache = use_offline_hf_cache(tmp_path / "hf_home", monkeypatch)
    put_dataset_in_hf_cache(cache, "org/chat", {f"data/{split}-00000-of-00001.jsonl": jsonl(rows)
                                                for split, rows in records.items()})
    return "hf:org/chat"


def named_files(tmp_path, monkeypatch, records: dict[str, list[dict]]) -> str:
    folder = tmp_path / "named"
    folder.mkdir()
    for split, rows in records.items():
        (folder / f"{split}.jsonl").write_text(jsonl(rows))
    return f"{folder}@train"


def plain_folder(tmp_path, monkeypatch, records: dict[str, list[dict]]) -> str:
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "chats.jsonl").write_text(jsonl(records["train"]))
    return str(folder)


SCORED = r"; each evaluation scores \d+ of them"  # (--eval_iters global batches)
CASES = [  # (how the data is given, task, its splits, the start-up line)
    (dataset_dict, "sft", {"train": TRAIN, "validation": VALIDATION},
     r"validation: 3 samples from the data's own split \S+my_dict@validation"),
    (hub_dataset, "sft", {"train": TRAIN, "test": VALIDATION},
     r"validation: 3 samples from the data's own split hf:org/chat@test"),
    (named_files, "sft", {"train": TRAIN, "validation": VALIDATION},
     r"validation: 3 samples from the data's own split \S+named@validation"),
    (plain_folder, "sft", {"train": TRAIN}, r"validation: held out from train: 1 samples"),
    (dataset_dict, "stream", {"train": [{"text": STORY}] * 4, "validation": [{"text": STORY}]},
     r"validation: 2 samples from the data's own split \S+my_dict@validation"),
]


@pytest.mark.parametrize("make, task, splits, line", CASES,
                         ids=["DatasetDict", "hf-id-test-split", "DIR@train", "plain-folder",
                              "stream-DatasetDict"])
def test_the_trainer_evaluates_on_the_datas_own_split_and_says_so(make, task, splits, line,
                                                                 tmp_path, monkeypatch,
                                                                 tiny_hf_tokenizer_dir, capsys):
    data_dir = make(tmp_path, monkeypatch, splits)
    task_args = (["--task_type=pretrain", "--data_format=stream"] if task == "stream"
                 else ["--task_type=sft"])
    assert run_main([*TINY_ARGS, *task_args, f"--data_dir={data_dir}",
                     f"--tokenizer_dir={tiny_hf_tokenizer_dir}", "--max_iters=1",
                     "--eval_interval=1", "--eval_prompts=[]",
                     f"--out_dir={tmp_path / 'run'}"]) == 0
    notes = [text for text in capsys.readouterr().out.splitlines()
             if text.startswith("validation:")]
    assert len(notes) == 1 and re.fullmatch(line + SCORED, notes[0]), notes
    if task == "sft":  # every train record trains when the data has its own validation split
        train, valid, _ = build_datasets("sft", data_dir, load_tokenizer(tiny_hf_tokenizer_dir), 32,
                                         num_workers=0)
        assert (len(train), len(valid)) == ((10, 3) if "own split" in line else (9, 1))
