"""Cleaning as an array of independent tasks: 3 tasks analyse their shares of the files at
the same time, then the plain command merges (deduplicates across every task's files and
writes the shards): the same bytes as one run."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from data.dirty_corpus import near_copy, shakespeare_scenes
from data_preprocess.clean_pretrain_data import main as clean_main
from utils.cli_errors import run_main
from utils.data_output_dir import LEDGER

REPO = Path(__file__).resolve().parents[3]


def write_jsonl(path: Path, texts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))


def corpus_with_copies_across_files(raw: Path) -> None:
    """Four files; exact and near copies of documents that sit in other files (other tasks'
    shares with 3 tasks: a, d -> task 0; b -> 1; c -> 2)."""
    scenes, rng = shakespeare_scenes(24), random.Random(0)
    write_jsonl(raw / "a.jsonl", scenes[:6])
    write_jsonl(raw / "b.jsonl", [*scenes[6:12], "  " + scenes[2].replace(" ", "   ")])
    write_jsonl(raw / "c.jsonl", [near_copy(scenes[8], rng, 0.01), *scenes[12:18]])
    write_jsonl(raw / "sub" / "d.jsonl", [*scenes[18:24], scenes[13], near_copy(scenes[4], rng,
                                                                              0.01)])


def visible_files(out: Path) -> dict[str, bytes]:
    """Shards and reports: everything but the hidden state and ledgers."""
    return {path.relative_to(out).as_posix(): path.read_bytes() for path in sorted(out.rglob("*"))
            if path.is_file() and not any(part.startswith(".")
                                          for part in path.relative_to(out).parts)}


def test_three_analysing_tasks_then_the_merge_equal_one_run(tmp_path, capsys):
    raw = tmp_path / "raw"
    corpus_with_copies_across_files(raw)
    options = ["--data_dir", str(raw), "--num_workers", "0", "--batch_size", "4"]
    running = [subprocess.Popen(
        [sys.executable, "-m", "data_preprocess.clean_pretrain_data", *options, "--out_dir",
         str(tmp_path / "tasks"), "--num_tasks", "3", "--task_index", str(index)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for index in range(3)]
    for process in running:
        output = process.communicate()[0]
        assert process.returncode == 0, output
    assert visible_files(tmp_path / "tasks") == {}  # tasks only analyse
    assert sorted(path.name for path in (tmp_path / "tasks").glob(".z2all_outputs*")) == [
        f".z2all_outputs.task-{index}-of-3.json" for index in range(3)]
    capsys.readouterr()
    assert run_main(clean_main, [*options, "--out_dir", str(tmp_path / "tasks")]) == 0
    assert "analysing 0 of 4 files (4 already done)" in capsys.readouterr().out
    assert run_main(clean_main, [*options, "--out_dir", str(tmp_path / "one")]) == 0
    merged, one = visible_files(tmp_path / "tasks"), visible_files(tmp_path / "one")
    assert merged == one
    report = json.loads(one["clean_report.json"])
    assert report["dropped"]["exact_duplicate"] == 2 and report["dropped"]["near_duplicate"] == 2
    assert sorted(path.name for path in (tmp_path / "tasks").glob(".z2all_outputs*")) == [LEDGER]


@pytest.mark.parametrize("argv, environ, message", [
    (["--num_tasks", "2", "--task_index", "2"], {},
     "--task_index must be in [0, 1] for --num_tasks 2, got 2"),
    ([], {"SLURM_ARRAY_TASK_COUNT": "0"},
     "--num_tasks must be >= 1, got 0 (from SLURM_ARRAY_TASK_COUNT)"),
    (["--num_tasks", "2", "--task_index", "0", "--write_dropped", "DROPPED"], {},
     "--write_dropped belongs to the merging run"),
])
def test_bad_task_options_are_one_line_before_any_work(tmp_path, capsys, monkeypatch, argv,
                                                       environ, message):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    write_jsonl(tmp_path / "raw" / "a.jsonl", ["some text"])
    argv = [arg.replace("DROPPED", str(tmp_path / "dropped")) for arg in argv]
    code = run_main(clean_main, ["--data_dir", str(tmp_path / "raw"), "--out_dir",
                                 str(tmp_path / "out"), *argv])
    error = capsys.readouterr().err.strip()
    assert code == 2 and message in error and len(error.splitlines()) == 1, error
    assert not (tmp_path / "out").exists() and not (tmp_path / "dropped").exists()


def test_slurm_array_variables_pick_the_task(tmp_path, monkeypatch, capsys):
    """`--array=1-3`: SLURM_ARRAY_TASK_ID 3 with SLURM_ARRAY_TASK_MIN 1 is task 2 of 3."""
    corpus_with_copies_across_files(tmp_path / "raw")
    for name, value in {"SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1",
                        "SLURM_ARRAY_TASK_ID": "3"}.items():
        monkeypatch.setenv(name, value)
    assert run_main(clean_main, ["--data_dir", str(tmp_path / "raw"), "--out_dir",
                                 str(tmp_path / "out"), "--num_workers", "0"]) == 0
    assert "task-2-of-3: analysed its 1 of 4 files" in capsys.readouterr().out
    state = tmp_path / "out" / ".clean"
    analysed = sorted(path.name for path in state.rglob("*.analysis.json"))
    assert analysed == ["c.jsonl.analysis.json"]


def staged(out: Path, stage: str, *extra: str) -> list[str]:
    """The arguments of one stage of the staged cleaning of the 4-file corpus in out/../raw."""
    return ["--data_dir", str(out.parent / "raw"), "--out_dir", str(out), "--num_workers", "0",
            "--batch_size", "4", "--stage", stage, *extra]


def run_stage(out: Path, stage: str, tasks: int | None = None, *extra: str) -> None:
    """One stage: every task of an array of `tasks`, or the stage once when None."""
    for index in range(tasks or 1):
        task = [] if tasks is None else ["--num_tasks", str(tasks), "--task_index", str(index)]
        assert run_main(clean_main, staged(out, stage, *task, *extra)) == 0


EVERY_STAGE = [("analyse", 3), ("buckets", 3), ("clusters", None), ("write", 3)]


def file_identities(folder: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of every file: an atomic replacement changes both."""
    return {path.relative_to(folder).as_posix(): (path.stat().st_ino, path.stat().st_mtime_ns)
            for path in sorted(folder.rglob("*")) if path.is_file()}


def test_three_tasks_through_every_stage_equal_one_run(tmp_path):
    """analyse, buckets and write as arrays of 3, clusters and merge once: the shards, the
    reports and the dropped documents are the bytes of one plain run."""
    corpus_with_copies_across_files(tmp_path / "raw")
    staged_out, one = tmp_path / "staged", tmp_path / "one"
    for stage, tasks in EVERY_STAGE:
        run_stage(staged_out, stage, tasks)
    assert sorted(visible_files(staged_out)) == ["a.jsonl", "b.jsonl", "c.jsonl",
                                                 "sub/d.jsonl"]  # the reports are the merge's
    run_stage(staged_out, "merge", None, "--write_dropped", str(tmp_path / "staged_dropped"))
    run_stage(one, "all", None, "--write_dropped", str(tmp_path / "one_dropped"))
    assert visible_files(staged_out) == visible_files(one)
    assert visible_files(tmp_path / "staged_dropped") == visible_files(tmp_path / "one_dropped")
    report = json.loads((one / "clean_report.json").read_text())
    assert report["dropped"]["exact_duplicate"] == 2 and report["dropped"]["near_duplicate"] == 2
    assert report["shards_reused"] == 0
    assert sorted(path.name for path in staged_out.glob(".z2all_outputs*")) == [LEDGER]
