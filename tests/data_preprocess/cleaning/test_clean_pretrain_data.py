"""The cleaning command end to end: planted copies, near copies, junk and a leaked eval item
are dropped and counted; the distinct good documents stay; output bytes do not depend on
--num_workers nor on the external sort's run size; a re-run skips finished shards; the
output pretokenizes as it is."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from data.dirty_corpus import near_copy, shakespeare_scenes
from data_preprocess.clean_pretrain_data import build_parser, clean_pretrain_data
from data_preprocess.clean_pretrain_data import main as clean_main
from data_preprocess.cleaning.filters import FilterOptions, first_failure
from data_preprocess.pretokenize_pretrain_data import pretokenize_pretrain_data
from utils.cli_errors import run_main as cli_run_main

REPO = Path(__file__).resolve().parents[3]
LEAK = ("Which planet in our solar system has the largest number of known moons orbiting "
        "around it today")


def write_jsonl(path: Path, texts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))


@pytest.fixture(scope="module")
def scenes() -> list[str]:
    return shakespeare_scenes(41)


def dirty_corpus(root: Path, scenes: list[str]) -> tuple[Path, Path]:
    """raw/a.jsonl: 40 good scenes; raw/sub/b.jsonl: one of each kind of dirt."""
    rng = random.Random(0)
    write_jsonl(root / "raw" / "a.jsonl", scenes[:40])
    dirt = ["  " + scenes[3].replace(" ", "   ") + "\n",  # an exact copy up to spacing
            near_copy(scenes[5], rng, 0.01),  # a near copy
            "\n".join(f"- Home page link {i}" for i in range(60)),  # a menu
            " ".join(["#buy #now #cheap and the best of deals"] * 20),  # hashtag spam
            scenes[40] + "\n\n" + LEAK.upper() + "?",  # a leaked eval question
            "   "]  # empty
    write_jsonl(root / "raw" / "sub" / "b.jsonl", dirt)
    write_jsonl(root / "eval" / "task.jsonl", [{"question": LEAK, "answer": "Saturn"}])
    return root / "raw", root / "eval"


def run(raw: Path, out: Path, *extra: str) -> dict:
    return clean_pretrain_data(build_parser().parse_args(
        ["--data_dir", str(raw), "--out_dir", str(out), *extra]))


def kept_texts(out: Path) -> list[str]:
    return [json.loads(line)["text"] for path in sorted(out.rglob("*.jsonl"))
            for line in path.read_text().splitlines()]


def test_dirt_is_dropped_and_counted_good_documents_kept(tmp_path, scenes):
    raw, eval_dir = dirty_corpus(tmp_path, scenes)
    report = run(raw, tmp_path / "clean", "--num_workers", "0", "--decontaminate", str(eval_dir))
    dropped = report["dropped"]
    assert dropped["exact_duplicate"] == 1 and dropped["near_duplicate"] == 1
    assert dropped["eval_contamination"] == 1 and dropped["empty"] == 1
    assert report["examples"]["exact_duplicate"][0] == {"document": "sub/b.jsonl:1",
                                                       "value": "a.jsonl:4"}
    assert "largest number of known moons" in report["examples"]["eval_contamination"][0]["value"]
    assert dropped.get("mostly_bullet_lines") == 1 and dropped.get("too_many_hashes") == 1
    good = [s for s in scenes[:40] if first_failure(s, ["gopher_quality", "gopher_repetition"],
                                                     FilterOptions()) is None]
    assert len(good) >= 20  # real prose mostly passes Gopher's rules
    assert kept_texts(tmp_path / "clean") == good
    assert report["documents_in"] == 46 and report["documents_out"] == len(good)
    markdown = (tmp_path / "clean" / "clean_report.md").read_text()
    assert "| near_duplicate | 1 |" in markdown and "sub/b.jsonl:2" in markdown
    # each rule's threshold beside the measured values, and datatrove's name for the rule
    assert "| mostly_bullet_lines | 1 | > 0.9 (--max_bullet_lines) | `sub/b.jsonl:3`: " in markdown
    assert markdown.split("mostly_bullet_lines | 1 |")[1].splitlines()[0].endswith(
        "| gopher_too_many_bullets |")
    assert report["rules"]["too_many_hashes"] == {"threshold": "> 0.1 (--max_symbol_word_ratio)",
                                                  "datatrove": "gopher_too_many_hashes"}
    assert set(report["rules"]) == set(dropped)


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.jsonl"))
            if ".clean" not in p.parts}


def test_same_bytes_for_any_worker_count_and_sort_run_size_and_rerun_skips(tmp_path, scenes,
                                                                           capsys):
    """w0 sorts each band in RAM (one run); w2 spills runs of 3 records (each band's 42
    records make 14 runs, merged in 3 passes): the same bytes and report, no file left."""
    raw, eval_dir = dirty_corpus(tmp_path, scenes)
    in_ram = run(raw, tmp_path / "w0", "--num_workers", "0", "--batch_size", "3")
    spilled = run(raw, tmp_path / "w2", "--num_workers", "2", "--batch_size", "3",
                  "--minhash_sort_records", "3")
    assert shard_bytes(tmp_path / "w0") == shard_bytes(tmp_path / "w2")
    assert in_ram == spilled and in_ram["dropped"]["near_duplicate"] == 1
    assert (tmp_path / "w0" / "clean_report.md").read_text() == (
        tmp_path / "w2" / "clean_report.md").read_text()
    assert not list((tmp_path / "w2" / ".clean").glob("sort-*"))
    (tmp_path / "w0" / ".clean" / "sort-killed").mkdir()  # as a killed run would leave it
    again = run(raw, tmp_path / "w0", "--num_workers", "0")
    printed = capsys.readouterr().out
    assert again["shards_reused"] == 2 and "analysing 0 of 2 files" in printed
    assert "removed 1 sort folder(s)" in printed
    assert not (tmp_path / "w0" / ".clean" / "sort-killed").exists()
    changed = run(raw, tmp_path / "w0", "--num_workers", "0", "--dedup", "exact")
    assert changed["shards_reused"] == 0 and "near_duplicate" not in changed["dropped"]


def test_cleaned_output_pretokenizes_as_is(tmp_path, scenes, tiny_hf_tokenizer_dir):
    raw, _ = dirty_corpus(tmp_path, scenes)
    report = run(raw, tmp_path / "clean", "--num_workers", "0")
    tokens = pretokenize_pretrain_data(tmp_path / "clean", tiny_hf_tokenizer_dir,
                                       tmp_path / "pretok", num_workers=0)
    assert tokens["num_documents"] == report["documents_out"] > 0
    assert tokens["files"] == 2  # the two shards; the report beside them is not read


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "data_preprocess.clean_pretrain_data", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("bad", [["--minhash_threshold", "1.5"], ["--dedup", "exact,fuzzy"],
                                 ["--no_such_option"], ["--filters", "c5"],
                                 ["--max_duplicate_ngram_chars", "5=0.1"],
                                 ["--minhash_sort_records", "2"]])
def test_bad_option_is_one_line_exit_2_before_any_work(tmp_path, bad):
    result = cli("--data_dir", str(tmp_path), "--out_dir", str(tmp_path / "out"), *bad)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert not (tmp_path / "out").exists()


def test_malformed_record_is_named_by_file_and_line(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n')
    result = cli("--data_dir", str(tmp_path / "raw"), "--out_dir", str(tmp_path / "out"),
                 "--num_workers", "0")
    assert result.returncode == 2 and "a.jsonl:2: malformed_json" in result.stderr


@pytest.mark.parametrize("records, why", [
    ([], "no records: is it the file you meant"),
    ([{"id": 1, "label": 3}, {"id": 2, "label": 0}], "2 records, none with a text field"),
    ([{"answer": "Saturn"}], "1 records, all 1 texts shorter than --decontaminate_min_words=8"),
])
def test_an_eval_file_with_nothing_to_match_is_refused_naming_it(tmp_path, capsys, records,
                                                                  why):
    """Before: 0 items, no word, and a report that said the corpus was decontaminated."""
    (tmp_path / "raw").mkdir()
    write_jsonl(tmp_path / "raw" / "a.jsonl", ["a training document of a few words"])
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps(record) + "\n" for record in records))
    argv = ["--data_dir", str(tmp_path / "raw"), "--out_dir", str(tmp_path / "out"),
            "--num_workers", "0", "--decontaminate", str(eval_file)]
    assert cli_run_main(clean_main, argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    assert error.startswith(f"error: --decontaminate: {eval_file} holds nothing to match ({why}")
    assert not (tmp_path / "out").exists()
