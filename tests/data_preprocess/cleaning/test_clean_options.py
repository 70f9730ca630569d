"""The cleaning command's checks and extra outputs, through its own main: every rule threshold
refused in one line when out of range, --write_dropped (the dropped documents by rule, in a
folder of its own), and the progress bar a terminal gets and a log does not."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from data.dirty_corpus import shakespeare_scenes
from data_preprocess.clean_pretrain_data import main
from data_preprocess.cleaning import dropped
from tests.data_preprocess.cleaning.test_clean_pretrain_data import (
    REPO,
    cli,
    dirty_corpus,
    run,
    shard_bytes,
)
from utils.cli_errors import run_main
from utils.data_output_dir import LEDGER, LEDGER_FORMAT


@pytest.fixture(scope="module")
def scenes() -> list[str]:
    return shakespeare_scenes(41)


@pytest.mark.parametrize(("bad", "named"), [
    (["--max_duplicate_ngram_chars", "0:0.1"], "--max_duplicate_ngram_chars: n in '0:0.1'"),
    (["--max_duplicate_ngram_chars", "5:nan"], "--max_duplicate_ngram_chars: fraction"),
    (["--max_duplicate_ngram_chars", "5:1.5"], "--max_duplicate_ngram_chars: fraction"),
    (["--max_bullet_lines", "nan"], "--max_bullet_lines must be a finite number in [0, 1]"),
    (["--max_bullet_lines", "5"], "--max_bullet_lines must be in [0, 1]"),
    (["--min_alpha_words", "-0.1"], "--min_alpha_words must be in [0, 1]"),
    (["--max_top_2gram_chars", "inf"], "--max_top_2gram_chars must be a finite number"),
    (["--max_mean_word_length", "nan"], "--max_mean_word_length must be a finite number"),
    (["--max_doc_words", "-1"], "--max_doc_words must be >= 0"),
    (["--min_stop_words", "-2"], "--min_stop_words must be >= 0"),
    (["--min_doc_words", "200", "--max_doc_words", "100"], "--min_doc_words 200 is above"),
    (["--seed", "-1"], "--seed must be >= 0")])
def test_bad_threshold_is_one_line_naming_the_option_exit_2(tmp_path, capsys, bad, named):
    """Through the command's own main and run_main: a nan once switched a rule off, a count
    given to a fraction was accepted, and n = 0 made the repeated-n-gram scan loop forever."""
    code = run_main(main, ["--data_dir", str(tmp_path), "--out_dir", str(tmp_path / "out"),
                           "--num_workers", "0", *bad])
    stderr = capsys.readouterr().err
    assert code == 2 and stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert named in stderr
    assert not (tmp_path / "out").exists()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_write_dropped_keeps_each_rules_documents_in_a_file_of_its_own(tmp_path, scenes):
    """As datatrove's exclusion writer: DIR/<rule>.jsonl holds every document the rule dropped
    (text, where it came from, the measured value); the shards are the same bytes as without
    the option; a rerun replaces its own files and removes those of rules that drop nothing."""
    raw, eval_dir = dirty_corpus(tmp_path, scenes)
    plain = run(raw, tmp_path / "plain", "--num_workers", "0")
    report = run(raw, tmp_path / "clean", "--num_workers", "0",
                 "--write_dropped", str(tmp_path / "dropped"))
    assert shard_bytes(tmp_path / "clean") == shard_bytes(tmp_path / "plain")
    assert report["dropped"] == plain["dropped"]
    files = sorted(p.name for p in (tmp_path / "dropped").glob("*.jsonl"))
    assert files == sorted(f"{rule}.jsonl" for rule in report["dropped"])
    menu = read_jsonl(tmp_path / "dropped" / "mostly_bullet_lines.jsonl")
    assert len(menu) == 1 and menu[0]["source"] == "sub/b.jsonl" and menu[0]["line"] == 3
    assert menu[0]["text"].startswith("- Home page link 0") and menu[0]["value"] > 0.9
    near = read_jsonl(tmp_path / "dropped" / "near_duplicate.jsonl")
    assert near[0]["value"] == "a.jsonl:6" and near[0]["rule"] == "near_duplicate"
    assert sum(len(read_jsonl(tmp_path / "dropped" / name)) for name in files) == (
        report["documents_in"] - report["documents_out"])
    again = run(raw, tmp_path / "clean", "--num_workers", "0", "--dedup", "exact",
                "--write_dropped", str(tmp_path / "dropped"))
    assert "near_duplicate" not in again["dropped"]
    assert not (tmp_path / "dropped" / "near_duplicate.jsonl").exists()
    assert (tmp_path / "dropped" / "exact_duplicate.jsonl").exists()


@pytest.mark.parametrize(("where", "named"), [
    ("foreign", "--write_dropped {dir} holds notes.txt, which clean_pretrain_data "
                "--write_dropped did not write"),
    ("copied_ledger", "--write_dropped {dir} lists notes.txt as its own, which is no rule's"),
    ("in_out_dir", "--write_dropped {dir} overlaps --out_dir"),
    ("data_dir", "--write_dropped {dir} overlaps --data_dir"),
    ("above_data_dir", "--write_dropped {dir} overlaps --data_dir"),
    ("a_file", "--write_dropped {dir} is a file")])
def test_write_dropped_refuses_a_folder_it_does_not_own(tmp_path, capsys, scenes, where, named):
    """New, empty or its own earlier output, apart from the input and the output: a user's
    notes are never mixed in or replaced, and dropped text never becomes input or output."""
    raw, _ = dirty_corpus(tmp_path, scenes)
    folder = {"in_out_dir": tmp_path / "out" / "dropped", "data_dir": raw,
              "above_data_dir": tmp_path, "a_file": tmp_path / "file"}.get(where, tmp_path / "mine")
    if where in ("foreign", "copied_ledger"):
        folder.mkdir()
        (folder / "notes.txt").write_text("keep me")
    if where == "copied_ledger":  # a ledger naming the user's file does not make it ours
        (folder / LEDGER).write_text(json.dumps(
            {"format": LEDGER_FORMAT, "version": 1, "owner": dropped.WRITER,
             "files": {"notes.txt": dropped.WRITER}}))
    if where == "a_file":
        folder.write_text("keep me")
    code = run_main(main, ["--data_dir", str(raw), "--out_dir", str(tmp_path / "out"),
                           "--num_workers", "0", "--write_dropped", str(folder)])
    stderr = capsys.readouterr().err
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert named.format(dir=folder) in stderr
    assert not (tmp_path / "out" / "clean_report.json").exists()
    if where in ("foreign", "copied_ledger"):
        assert (folder / "notes.txt").read_text() == "keep me"


def run_on_a_terminal(argv: list[str]) -> str:
    """The command with stdout and stderr on a pseudo-terminal, as a person runs it."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns
    try:
        process = subprocess.Popen(argv, cwd=REPO, stdout=follower, stderr=follower)
        os.close(follower)
        output = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the command closed the terminal (it exited)
                break
            if not chunk:
                break
            output += chunk
        process.wait(timeout=120)
    finally:
        os.close(leader)
    return output.decode("utf-8", "replace")


def test_progress_bar_with_eta_on_a_terminal_only(tmp_path, scenes):
    raw, _ = dirty_corpus(tmp_path, scenes)
    command = [sys.executable, "-m", "data_preprocess.clean_pretrain_data", "--data_dir",
               str(raw), "--num_workers", "0"]
    shown = run_on_a_terminal([*command, "--out_dir", str(tmp_path / "tty")])
    bar = [line for line in shown.replace("\r", "\n").splitlines()
           if line.startswith("analysing: 100%")]
    assert bar and "<00:00" in bar[-1], shown  # tqdm's "elapsed<left" (the ETA)
    logged = cli(*command[3:], "--out_dir", str(tmp_path / "log"))
    assert logged.returncode == 0 and "\r" not in logged.stderr + logged.stdout
    assert "analysing:" not in logged.stderr and "cleaned 46 documents" in logged.stdout
