"""Pretokenizing as an array of independent tasks (utils/array_tasks.py): N tasks writing one
folder at the same time give the bytes of one task, each keeps its own ledger, and a plain
run afterwards merges them."""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from data_preprocess import (
    build_pretrain_sample_index_map,
    pretokenize_chat,
    pretokenize_pretrain_data,
)
from tests.data_preprocess.test_pretokenize_pretrain_data import final_files, random_text
from utils.cli_errors import run_main
from utils.data_output_dir import LEDGER

REPO = Path(__file__).resolve().parents[2]
FILES = ["a.jsonl", "b.jsonl", "c.jsonl", "sub/d.jsonl", "sub/e.jsonl"]


def write_files(data_dir: Path, names: list[str] = FILES) -> None:
    rng = random.Random(7)
    for name in names:
        (data_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (data_dir / name).write_text("".join(json.dumps({"text": random_text(rng)}) + "\n"
                                             for _ in range(12)))


def command(data: Path, out: Path, tokenizer: Path) -> list[str]:
    return [sys.executable, "-m", "data_preprocess.pretokenize_pretrain_data", "--data_dir",
            str(data), "--tokenizer_dir", str(tokenizer), "--out_dir", str(out),
            "--num_workers", "0", "--batch_size", "4"]


def slurm_env(task_id: int, count: int = 3, first: int = 1) -> dict[str, str]:
    """An array `--array=1-3`: ids start at SLURM_ARRAY_TASK_MIN."""
    return {**os.environ, "SLURM_ARRAY_TASK_COUNT": str(count),
            "SLURM_ARRAY_TASK_MIN": str(first), "SLURM_ARRAY_TASK_ID": str(task_id)}


def outputs(folder: Path) -> dict[str, bytes]:
    """The token files and sidecars (final_files less the array tasks' reports)."""
    return {name: data for name, data in final_files(folder).items()
            if not name.startswith("pretokenize_report.")}


def index_files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.glob("*.ibin"))}


def build_index(folder: Path) -> None:
    assert run_main(build_pretrain_sample_index_map.main,
                    ["--data_dir", str(folder), "--max_seq_len", "8"]) == 0


def test_three_concurrent_tasks_equal_one_task_and_a_plain_run_merges(tmp_path,
                                                                     tiny_hf_tokenizer_dir):
    data = tmp_path / "raw"
    write_files(data)
    one, tasks = tmp_path / "one", tmp_path / "tasks"
    subprocess.run(command(data, one, tiny_hf_tokenizer_dir), cwd=REPO, check=True,
                   capture_output=True)
    running = [subprocess.Popen(command(data, tasks, tiny_hf_tokenizer_dir), cwd=REPO,
                                env=slurm_env(task_id), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for task_id in (1, 2, 3)]
    for process in running:
        output = process.communicate()[0]
        assert process.returncode == 0, output
    assert outputs(tasks) == outputs(one)
    for index in range(3):  # sorted files, position p -> task p % 3
        report = json.loads((tasks / f"pretokenize_report.task-{index}-of-3.json").read_text())
        assert [entry["source"] for entry in report["per_file"]] == FILES[index::3]
        ledger = json.loads((tasks / f".z2all_outputs.task-{index}-of-3.json").read_text())
        assert ledger["owner"] == "pretokenize_pretrain_data"
        assert {name.rsplit(".", 1)[0] for name in ledger["files"]} == {
            *(Path(name).with_suffix("").as_posix() for name in FILES[index::3]),
            f"pretokenize_report.task-{index}-of-3"}
    assert not (tasks / LEDGER).exists()
    build_index(one)
    build_index(tasks)  # over the tasks' folder as they left it
    assert index_files(tasks) == index_files(one)
    # the merge: the plain command reuses every file, writes one ledger and report
    merged = pretokenize_pretrain_data.pretokenize_pretrain_data(
        data, tiny_hf_tokenizer_dir, tasks, num_workers=0, batch_size=4)
    assert merged["files_reused"] == len(FILES)
    assert sorted(path.name for path in tasks.glob(".z2all_outputs*")) == [LEDGER]
    assert not list(tasks.glob("pretokenize_report.task-*"))
    assert final_files(tasks) == final_files(one)  # the index files were kept, as guests
    assert json.loads((tasks / LEDGER).read_text())["files"] == \
        json.loads((one / LEDGER).read_text())["files"]


def test_a_task_leaves_the_files_that_moved_to_another_tasks_share(tmp_path,
                                                                  tiny_hf_tokenizer_dir):
    """Removing an input shifts the shares; a task deletes only the outputs of the removed
    input, never those another task now reuses."""
    data, out = tmp_path / "raw", tmp_path / "out"
    write_files(data)
    for index in range(2):
        pretokenize_pretrain_data.pretokenize_pretrain_data(
            data, tiny_hf_tokenizer_dir, out, num_workers=0, num_tasks=2, task_index=index)
    (data / "a.jsonl").unlink()
    first = pretokenize_pretrain_data.pretokenize_pretrain_data(
        data, tiny_hf_tokenizer_dir, out, num_workers=0, num_tasks=2, task_index=0)
    assert [entry["reused"] for entry in first["per_file"]] == [True, True]  # b, sub/d
    assert not (out / "a.bin").exists() and (out / "c.bin").exists()  # c: task 1's now
    second = pretokenize_pretrain_data.pretokenize_pretrain_data(
        data, tiny_hf_tokenizer_dir, out, num_workers=0, num_tasks=2, task_index=1)
    assert second["files_reused"] == 2  # c, sub/e


@pytest.mark.parametrize("main, argv, environ, message", [
    (pretokenize_pretrain_data.main, ["--num_tasks", "0"], {}, "--num_tasks must be >= 1"),
    (pretokenize_pretrain_data.main, ["--num_tasks", "3", "--task_index", "3"], {},
     "--task_index must be in [0, 2] for --num_tasks 3, got 3"),
    (pretokenize_pretrain_data.main, [], {"SLURM_ARRAY_TASK_COUNT": "2",
                                          "SLURM_ARRAY_TASK_ID": "2"},
     "--task_index must be in [0, 1] for --num_tasks 2, got 2 (from SLURM_ARRAY_TASK_ID"),
    (pretokenize_pretrain_data.main, [], {"SLURM_ARRAY_TASK_COUNT": "x"},
     "SLURM_ARRAY_TASK_COUNT='x' is not a whole number"),
    (functools.partial(pretokenize_chat.main, "sft"),
     ["--max_seq_len", "16", "--task_index", "-1"], {},
     "--task_index must be in [0, 0] for --num_tasks 1, got -1"),
])
def test_bad_task_options_are_refused_in_one_line_before_any_work(
        tmp_path, tiny_hf_tokenizer_dir, capsys, monkeypatch, main, argv, environ, message):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    write_files(tmp_path / "raw", FILES[:1])
    code = run_main(main, ["--data_dir", str(tmp_path / "raw"), "--tokenizer_dir",
                           str(tiny_hf_tokenizer_dir), "--out_dir", str(tmp_path / "out"), *argv])
    error = capsys.readouterr().err.strip()
    assert code == 2 and message in error and len(error.splitlines()) == 1, error
    assert not (tmp_path / "out").exists()
