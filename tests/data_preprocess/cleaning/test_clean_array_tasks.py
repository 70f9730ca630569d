"""Cleaning as an array of independent tasks: 3 tasks analyse their shares of the files at
the same time, then the plain command merges (deduplicates across every task's files and
writes the shards): the same bytes as one run."""

from __future__ import annotations

import json
import os
import random
import shutil
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


def staged(raw: Path, out: Path, stage: str, *extra: str) -> list[str]:
    """The arguments of one stage of cleaning `raw` into `out`."""
    return ["--data_dir", str(raw), "--out_dir", str(out), "--num_workers", "0",
            "--batch_size", "4", "--stage", stage, *extra]


def run_stage(raw: Path, out: Path, stage: str, indices: list[int] | None = None,
              *extra: str) -> None:
    """One stage: tasks `indices` of an array of 3, or the stage once when None."""
    for index in [None] if indices is None else indices:
        task = [] if index is None else ["--num_tasks", "3", "--task_index", str(index)]
        assert run_main(clean_main, staged(raw, out, stage, *task, *extra)) == 0


# (snapshot name, stage, task indices of 3 or None: once), run in this order
STAGE_STEPS = [("analyse-0-2", "analyse", [0, 2]), ("analysed", "analyse", [1]),
               ("buckets-0-2", "buckets", [0, 2]), ("bucketed", "buckets", [1]),
               ("clustered", "clusters", None),
               ("write-0-2", "write", [0, 2]), ("written", "write", [1])]


@pytest.fixture(scope="module")
def stages(tmp_path_factory) -> dict[str, Path]:
    """The corpus (`raw`), one plain run of it (`one`, its dropped documents `one-dropped`),
    and a copy of the staged --out_dir after each step of STAGE_STEPS."""
    root = tmp_path_factory.mktemp("stages")
    folders = {"raw": root / "raw", "one": root / "one", "one-dropped": root / "one-dropped"}
    corpus_with_copies_across_files(folders["raw"])
    run_stage(folders["raw"], folders["one"], "all", None, "--write_dropped",
              str(folders["one-dropped"]))
    for name, stage, indices in STAGE_STEPS:
        run_stage(folders["raw"], root / "out", stage, indices)
        folders[name] = Path(shutil.copytree(root / "out", root / name, symlinks=True))
    return folders


def test_three_tasks_through_every_stage_equal_one_run(stages, tmp_path):
    """analyse, buckets and write as arrays of 3, clusters and merge once: the shards, the
    reports and the dropped documents are the bytes of one plain run."""
    assert sorted(visible_files(stages["written"])) == ["a.jsonl", "b.jsonl", "c.jsonl",
                                                         "sub/d.jsonl"]  # no report yet
    out = Path(shutil.copytree(stages["written"], tmp_path / "out", symlinks=True))
    run_stage(stages["raw"], out, "merge", None, "--write_dropped", str(tmp_path / "dropped"))
    assert visible_files(out) == visible_files(stages["one"])
    assert visible_files(tmp_path / "dropped") == visible_files(stages["one-dropped"])
    report = json.loads((out / "clean_report.json").read_text())
    assert report["dropped"]["exact_duplicate"] == 2 and report["dropped"]["near_duplicate"] == 2
    assert report["shards_reused"] == 0
    assert sorted(path.name for path in out.glob(".z2all_outputs*")) == [LEDGER]


AGED_NS = 10**18  # 2001: a file with another mtime was written after `age_every_file`


def age_every_file(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            os.utime(path, ns=(AGED_NS, AGED_NS))


def files_written_since_aged(folder: Path) -> list[str]:
    """The files written (or replaced, atomically) since `age_every_file`, and new ones."""
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*")
                  if path.is_file() and path.stat().st_mtime_ns != AGED_NS)


REPORTS_AND_LEDGER = [".z2all_outputs.json", "clean_report.json", "clean_report.md"]
SHARDS = ["a.jsonl", "b.jsonl", "c.jsonl", "sub/d.jsonl"]


@pytest.mark.parametrize("snapshot, rewritten", [
    ("clustered", [*REPORTS_AND_LEDGER, *SHARDS,
                   *(f".clean/{shard}.shard.json" for shard in SHARDS)]),
    ("written", REPORTS_AND_LEDGER),
])
def test_the_plain_command_after_the_stages_reuses_them_and_equals_one_run(stages, tmp_path,
                                                                          snapshot, rewritten):
    """The plain command (no --stage) after the clusters stage, or after every write task:
    it takes the analyses, duplicates.json and each <file>.written.json of this run instead
    of redoing that work (after the write tasks it writes only the reports and the ledger),
    and writes the bytes of one plain run."""
    out = Path(shutil.copytree(stages[snapshot], tmp_path / "out", symlinks=True))
    age_every_file(out)
    run_stage(stages["raw"], out, "all", None)
    assert files_written_since_aged(out) == sorted(rewritten)
    assert visible_files(out) == visible_files(stages["one"])
    assert not list((out / ".clean").glob("*.written.json"))  # spent: the merge removed them


@pytest.mark.parametrize("snapshot, stage, extra, message", [
    ("analyse-0-2", "buckets", [],
     "lacks .clean/b.jsonl.analysis.json (missing, unfinished, or made with other options or "
     "inputs); run --stage analyse (every task) first"),
    ("analysed", "buckets", ["--minhash_threshold", "0.8"],
     "lacks .clean/a.jsonl.analysis.json, .clean/b.jsonl.analysis.json, "
     ".clean/c.jsonl.analysis.json and 1 more"),
    ("buckets-0-2", "clusters", [],
     "lacks .clean/buckets/band-0001.json, .clean/buckets/band-0004.json, "
     ".clean/buckets/band-0007.json and 2 more"),
    ("bucketed", "write", ["--num_tasks", "3", "--task_index", "0"],
     "lacks .clean/duplicates.json (missing, unfinished, or made with other options or "
     "inputs); run --stage clusters first"),
    ("write-0-2", "merge", [],
     "lacks .clean/b.jsonl.written.json (missing, unfinished, or made with other options or "
     "inputs); run --stage write (every task) first"),
    ("bucketed", "clusters", ["--num_tasks", "3", "--task_index", "1"],
     "--stage clusters runs once"),
])
def test_a_stage_before_its_inputs_is_one_line_and_writes_nothing(stages, tmp_path, capsys,
                                                                   snapshot, stage, extra,
                                                                   message):
    out = Path(shutil.copytree(stages[snapshot], tmp_path / "out", symlinks=True))
    age_every_file(out)
    capsys.readouterr()
    assert run_main(clean_main, staged(stages["raw"], out, stage, *extra)) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1, error
    assert files_written_since_aged(out) == []


@pytest.mark.parametrize("snapshot, stage, lost, rewritten, then", [
    # task 1 of 3 has bands 1, 4, 7, 10, 13, and the file b.jsonl
    ("bucketed", "buckets", ".clean/buckets/band-0004.json",
     [".clean/buckets/band-0004.json", ".clean/buckets/band-0004.pairs"],
     [("clusters", None), ("write", [0, 1, 2])]),
    ("written", "write", "b.jsonl",
     [".clean/b.jsonl.shard.json", ".clean/b.jsonl.written.json", "b.jsonl"], []),
])
def test_a_rerun_of_one_task_replaces_only_its_own_outputs(stages, tmp_path, snapshot, stage,
                                                           lost, rewritten, then):
    """Task 1 of 3 was killed after losing one output: its rerun redoes that one, and touches
    no other task's file; the later stages and the merge then give the one run's bytes."""
    out = Path(shutil.copytree(stages[snapshot], tmp_path / "out", symlinks=True))
    (out / lost).unlink()
    age_every_file(out)
    run_stage(stages["raw"], out, stage, [1])
    assert files_written_since_aged(out) == sorted([*rewritten,
                                                    ".z2all_outputs.task-1-of-3.json"])
    for later, indices in [*then, ("merge", None)]:
        run_stage(stages["raw"], out, later, indices)
    assert visible_files(out) == visible_files(stages["one"])
