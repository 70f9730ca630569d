"""Pretokenization: Megatron-readable output, worker-count independence, crash safety, bad input."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tqdm import tqdm

from data_preprocess import pretokenize_pretrain_data as pretokenize_module
from data_preprocess import worker_pool
from data_preprocess.pretokenize_pretrain_data import pretokenize_pretrain_data
from tests.hf_cache_helpers import parquet_bytes, put_dataset_in_hf_cache, use_offline_hf_cache
from tests.megatron_spec_reader import read_by_spec
from tokenizer import load_tokenizer
from utils.cli_errors import run_main
from utils.readers import BadRecordError

REPO = Path(__file__).resolve().parents[2]
PIECES = ["the", "model", "数据", "训练", "😀", " ", "\n", "\t", "naïve", "<|endoftext|>",
          "<|im_start|>", "42", "def f(x):", "—", "テキスト"]


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) + rng.choice(["", " "]) for _ in range(rng.randint(1, 30)))


def write_corpus(data_dir: Path, rng: random.Random, docs_per_file: int = 20) -> dict[str, list]:
    """A .jsonl, a .json array and a .parquet file (one in a subfolder); returns their texts."""
    texts = {name: [random_text(rng) for _ in range(docs_per_file)]
             for name in ("a.jsonl", "b.json", "sub/c.parquet")}
    texts["a.jsonl"][3] = "   \n"  # whitespace only: skipped as `empty`
    (data_dir / "sub").mkdir(parents=True)
    (data_dir / "a.jsonl").write_text(
        "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts["a.jsonl"]))
    (data_dir / "b.json").write_text(json.dumps([{"text": t} for t in texts["b.json"]]))
    pq.write_table(pa.table({"text": texts["sub/c.parquet"]}), data_dir / "sub/c.parquet")
    return texts


def final_files(out_dir: Path) -> dict[str, bytes]:
    """Every non-hidden output except the report (which holds timings)."""
    return {p.relative_to(out_dir).as_posix(): p.read_bytes() for p in sorted(out_dir.rglob("*"))
            if p.is_file() and not p.name.startswith(".") and p.name != "pretokenize_report.json"}


@pytest.mark.parametrize("tokenizer_fixture", ["tiny_hf_tokenizer_dir", "tiny_sp_tokenizer_dir"])
def test_spec_reader_sees_tokenizer_ids(tmp_path, request, tokenizer_fixture):
    tokenizer_dir = request.getfixturevalue(tokenizer_fixture)
    texts = write_corpus(tmp_path / "raw", random.Random())
    report = pretokenize_pretrain_data(tmp_path / "raw", tokenizer_dir, tmp_path / "out",
                                       num_workers=1, batch_size=4)
    tokenizer = load_tokenizer(tokenizer_dir)
    for name, file_texts in texts.items():
        prefix = tmp_path / "out" / Path(name).with_suffix("")
        expected = [tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id]
                    for t in file_texts if t.strip()]
        spec = read_by_spec(prefix)
        assert spec["dtype"] == np.uint16
        assert [s.tolist() for s in spec["sequences"]] == expected
        assert spec["document_indices"].tolist() == list(range(len(expected) + 1))
        sidecar = json.loads(prefix.with_suffix(".json").read_text())
        assert sidecar["num_documents"] == len(expected)
        assert sidecar["tokenizer"] == tokenizer.fingerprint
    blank = sum(not t.strip() for file_texts in texts.values() for t in file_texts)
    assert report["skipped"] == {"empty": blank}


def test_worker_count_does_not_change_bytes(tmp_path, tiny_hf_tokenizer_dir):
    write_corpus(tmp_path / "raw", random.Random(), docs_per_file=40)
    for workers in (1, 2):
        pretokenize_pretrain_data(tmp_path / "raw", tiny_hf_tokenizer_dir, tmp_path / f"w{workers}",
                                  num_workers=workers, batch_size=3)
    assert final_files(tmp_path / "w1") == final_files(tmp_path / "w2")


def test_repeated_run_reuses_and_changed_source_is_redone(tmp_path, tiny_hf_tokenizer_dir):
    write_corpus(tmp_path / "raw", random.Random())
    pretokenize_pretrain_data(tmp_path / "raw", tiny_hf_tokenizer_dir, tmp_path / "out",
                              num_workers=1)
    again = pretokenize_pretrain_data(tmp_path / "raw", tiny_hf_tokenizer_dir, tmp_path / "out",
                                      num_workers=1)
    assert again["files_reused"] == 3
    with open(tmp_path / "raw/a.jsonl", "a") as handle:
        handle.write(json.dumps({"text": "one more document"}) + "\n")
    third = pretokenize_pretrain_data(tmp_path / "raw", tiny_hf_tokenizer_dir, tmp_path / "out",
                                      num_workers=1)
    redone = [entry["source"] for entry in third["per_file"] if not entry["reused"]]
    assert redone == ["a.jsonl"]


def test_the_bar_counts_input_bytes_to_a_total(tmp_path, tiny_hf_tokenizer_dir, capsys):
    """The total is known before reading (the files' sizes), so the bar has a percentage and an
    ETA; .json and .parquet count whole when done, .jsonl/.txt as their lines are read."""
    write_corpus(tmp_path / "raw", random.Random(), docs_per_file=40)
    total = sum(path.stat().st_size for path in (tmp_path / "raw").rglob("*.*"))
    pretokenize_module.main(["--data_dir", str(tmp_path / "raw"), "--tokenizer_dir",
                             str(tiny_hf_tokenizer_dir), "--out_dir", str(tmp_path / "out"),
                             "--num_workers", "0", "--batch_size", "4"])
    bar = capsys.readouterr().err.split("\r")[-1]
    shown = tqdm.format_sizeof(total)  # as the bar writes it, e.g. "13.1k"
    assert "100%|" in bar and f"{shown}/{shown}" in bar
    report = json.loads((tmp_path / "out/pretokenize_report.json").read_text())
    # the postfix counts the same work as the bar: every file's documents and tokens
    assert f"docs={report['num_documents']}, tokens={report['num_tokens']}" in bar, bar


def test_a_rerun_bar_counts_only_what_it_reads(tmp_path, tiny_hf_tokenizer_dir, capsys):
    """Reused files are neither in the bar's total (bytes to read) nor in its postfix."""
    write_corpus(tmp_path / "raw", random.Random(), docs_per_file=10)
    argv = ["--data_dir", str(tmp_path / "raw"), "--tokenizer_dir", str(tiny_hf_tokenizer_dir),
            "--out_dir", str(tmp_path / "out"), "--num_workers", "0"]
    pretokenize_module.main(argv)
    (tmp_path / "raw/d.jsonl").write_text("".join(
        json.dumps({"text": f"new document {n}"}) + "\n" for n in range(7)))
    capsys.readouterr()
    pretokenize_module.main(argv)
    bar = capsys.readouterr().err.split("\r")[-1]
    report = json.loads((tmp_path / "out/pretokenize_report.json").read_text())
    new = next(entry for entry in report["per_file"] if entry["source"] == "d.jsonl")
    shown = tqdm.format_sizeof((tmp_path / "raw/d.jsonl").stat().st_size)
    assert f"{shown}/{shown}" in bar and f"docs=7, tokens={new['num_tokens']}" in bar, bar


def test_sigkill_midway_then_rerun_matches_uninterrupted(tmp_path, tiny_hf_tokenizer_dir):
    rng = random.Random()
    raw = tmp_path / "raw"
    raw.mkdir()
    for number in range(4):
        (raw / f"part{number}.jsonl").write_text("".join(
            json.dumps({"text": random_text(rng)}) + "\n" for _ in range(800)))
    command = [sys.executable, "-m", "data_preprocess.pretokenize_pretrain_data",
               "--data_dir", str(raw), "--tokenizer_dir", str(tiny_hf_tokenizer_dir),
               "--num_workers", "1", "--batch_size", "8"]
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([*command, "--out_dir", str(tmp_path / "killed")], cwd=REPO,
                               env=environment, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "killed").glob("*.json")) and process.poll() is None:
        assert time.monotonic() < deadline, "pretokenization made no progress"
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)  # the main process and its workers, mid-run
    process.wait()
    killed = tmp_path / "killed"
    assert len(list(killed.glob("*.json"))) < 4, "the run finished before it could be killed"
    for idx_path in killed.glob("*.idx"):  # whatever has a final name is complete
        if idx_path.with_suffix(".json").exists():
            read_by_spec(idx_path.with_suffix(""))

    subprocess.run([*command, "--out_dir", str(killed)], cwd=REPO, env=environment, check=True,
                   capture_output=True)
    pretokenize_pretrain_data(raw, tiny_hf_tokenizer_dir, tmp_path / "clean", num_workers=2)
    assert final_files(killed) == final_files(tmp_path / "clean")
    assert not [p for p in killed.rglob(".*.tmp") if p.is_file()], "temp files left behind"


BAD_LINES = {"malformed_json": b'{"text": "broken', "missing_key": b'{"content": "wrong key"}',
             "invalid_utf8": b'{"text": "bad \xff byte"}'}
GOOD_LINE = b'{"text": "good"}'


def write_bad_corpus(raw: Path) -> None:
    raw.mkdir()
    empty_lines = [b'{"text": ""}', b'{"text": " \\t "}']  # empty and whitespace only
    (raw / "a.jsonl").write_bytes(b"\n".join([GOOD_LINE, *BAD_LINES.values(), *empty_lines,
                                              GOOD_LINE]) + b"\n")


@pytest.mark.parametrize("reason", sorted(BAD_LINES))
def test_bad_record_names_file_and_line(tmp_path, tiny_hf_tokenizer_dir, reason):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw/a.jsonl").write_bytes(b"\n".join([GOOD_LINE, BAD_LINES[reason], GOOD_LINE])
                                           + b"\n")
    with pytest.raises(BadRecordError, match=f"a.jsonl:2: {reason}"):
        pretokenize_pretrain_data(tmp_path / "raw", tiny_hf_tokenizer_dir, tmp_path / "out",
                                  num_workers=1)
    assert not (tmp_path / "out/a.bin").exists() and not (tmp_path / "out/a.json").exists()


def test_skip_bad_records_counts_exactly(tmp_path, tiny_hf_tokenizer_dir, capsys):
    write_bad_corpus(tmp_path / "raw")
    report = pretokenize_pretrain_data(tmp_path / "raw", tiny_hf_tokenizer_dir, tmp_path / "out",
                                       num_workers=1, skip_bad_records=True)
    expected = {"empty": 2, "invalid_utf8": 1, "malformed_json": 1, "missing_key": 1}
    assert report["skipped"] == expected
    saved = json.loads((tmp_path / "out/pretokenize_report.json").read_text())
    assert saved["skipped"] == expected and saved["num_documents"] == 2
    assert "skipped 3 bad records" in capsys.readouterr().out


def test_truncated_parquet_names_the_file(tmp_path, tiny_hf_tokenizer_dir):
    (tmp_path / "raw").mkdir()
    pq.write_table(pa.table({"text": [f"document {i}" for i in range(50)]}),
                   tmp_path / "raw/c.parquet")
    data = (tmp_path / "raw/c.parquet").read_bytes()
    (tmp_path / "raw/c.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(BadRecordError, match="c.parquet"):
        pretokenize_pretrain_data(tmp_path / "raw", tiny_hf_tokenizer_dir, tmp_path / "out",
                                  num_workers=1, skip_bad_records=True)


def fail_on_seven(batch: list[int]) -> list[int]:
    if 7 in batch:
        raise RuntimeError("worker failed on 7")
    return batch


def die_on_seven(batch: list[int]) -> list[int]:
    if 7 in batch:
        os._exit(1)  # like the OOM killer: no exception, the process is just gone
    return batch


@pytest.mark.parametrize("function, error", [(fail_on_seven, RuntimeError),
                                             (die_on_seven, BrokenProcessPool)])
def test_worker_failure_fails_the_run(function, error):
    pool = ProcessPoolExecutor(2, mp_context=worker_pool.worker_context())
    with pool, pytest.raises(error):
        list(worker_pool.ordered_map(pool, function, ([i] for i in range(20)), max_in_flight=4))


def test_a_save_to_disk_dataset_gives_the_bytes_of_the_same_texts_as_jsonl(
        tmp_path, tiny_hf_tokenizer_dir):
    """`datasets`' save_to_disk folders (a Dataset, and a DatasetDict's `train` split) are read
    as their .arrow shards, not their metadata JSON, with the tokens of the same jsonl texts."""
    datasets = pytest.importorskip("datasets")
    texts = [random_text(random.Random(seed)) for seed in range(30)]
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "jsonl/data.jsonl").write_text(
        "".join(json.dumps({"text": t, "id": i}, ensure_ascii=False) + "\n"
                for i, t in enumerate(texts)))
    table = {"text": texts, "id": list(range(len(texts)))}
    datasets.Dataset.from_dict(table).save_to_disk(tmp_path / "saved")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(table),
                          "test": datasets.Dataset.from_dict({"text": ["x"], "id": [0]})}
                         ).save_to_disk(tmp_path / "saved_dict")
    outputs = []
    for source in ("jsonl", "saved", "saved_dict"):
        pretokenize_pretrain_data(tmp_path / source, tiny_hf_tokenizer_dir,
                                  tmp_path / f"out_{source}", num_workers=1)
        bins = sorted((tmp_path / f"out_{source}").rglob("*.bin"))
        outputs.append([path.read_bytes() for path in bins])
    assert len(outputs[0]) == 1 and outputs[0] == outputs[1] == outputs[2]
    shard = next((tmp_path / "saved").glob("*.arrow"))
    shard.write_bytes(shard.read_bytes()[:200])
    with pytest.raises(BadRecordError, match=rf"{shard}:1: corrupt_arrow"):
        pretokenize_pretrain_data(tmp_path / "saved", tiny_hf_tokenizer_dir, tmp_path / "bad",
                                  num_workers=1)


def test_a_hub_dataset_id_gives_the_bytes_of_the_same_texts_as_jsonl(
        tmp_path, monkeypatch, capsys, tiny_hf_tokenizer_dir):
    """`--data_dir hf:org/name` reads the dataset's `train` files from an offline HF cache (its
    test split left out) and writes the tokens of the same texts as a .jsonl; without an
    --out_dir (the default would sit next to the id) it is refused in one line."""
    hub_cache = use_offline_hf_cache(tmp_path / "hf_home", monkeypatch)
    texts = [random_text(random.Random(seed)) for seed in range(30)]
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "jsonl/data.jsonl").write_text(
        "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts))
    put_dataset_in_hf_cache(hub_cache, "org/texts", {
        "data/train-00000-of-00001.parquet": parquet_bytes(pa.table({"text": texts})),
        "data/test-00000-of-00001.parquet": parquet_bytes(pa.table({"text": ["held out"]}))})
    common = ["--tokenizer_dir", str(tiny_hf_tokenizer_dir), "--num_workers", "0"]
    for source, out in (("hf:org/texts", "out_hub"), (str(tmp_path / "jsonl"), "out_jsonl")):
        assert run_main(pretokenize_module.main,
                        ["--data_dir", source, "--out_dir", str(tmp_path / out), *common]) == 0
    hub_bins = sorted((tmp_path / "out_hub").rglob("*.bin"))
    assert [path.relative_to(tmp_path / "out_hub").as_posix() for path in hub_bins] == \
        ["data/train-00000-of-00001.bin"]
    assert hub_bins[0].read_bytes() == (tmp_path / "out_jsonl/data.bin").read_bytes()
    capsys.readouterr()
    assert run_main(pretokenize_module.main, ["--data_dir", "hf:org/texts", *common]) == 2
    assert capsys.readouterr().err == ("error: --data_dir hf:org/texts names data by id or "
                                       "split: give --out_dir (the default, <data_dir>_pretok, "
                                       "is for a folder)\n")
