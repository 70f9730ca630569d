"""Every data tool that writes a folder writes only into its own (utils/data_output_dir.py):
new, empty or its earlier output, never over or inside its input or a run; a refusal is one
line naming the path and the first foreign entry, exit 2, with nothing written. A rerun into
its own folder removes the outputs of inputs that are gone, so nothing downstream reads them."""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from data_preprocess import (
    build_pretrain_sample_index_map,
    clean_pretrain_data,
    pretokenize_chat,
    pretokenize_pretrain_data,
)
from utils.cli_errors import run_main
from utils.data_output_dir import LEDGER, OutputLedger

SCENE = ("The quick brown fox jumps over the lazy dog near the quiet river bank. "
         "A small bird sings a song in the tall green tree while the sun goes down. ")


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def texts(seed: int, count: int = 3) -> list[dict]:
    return [{"text": f"Document {seed}-{i}. " + SCENE * (2 + i)} for i in range(count)]


def sft(seed: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"question {seed} {i}"},
                          {"role": "assistant", "content": f"answer {seed} {i} " * 3}]}
            for i in range(3)]


def dpo(seed: int) -> list[dict]:
    return [{"prompt": f"prompt {seed} {i}", "chosen": f"good {seed} {i}",
             "rejected": f"bad {seed} {i}"} for i in range(3)]


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def clean(tmp: Path, data: Path, out: Path, tokenizer: Path) -> list[str]:
    return [clean_pretrain_data.main, "--data_dir", str(data), "--out_dir", str(out),
            "--num_workers", "0"]


def pretrain(tmp: Path, data: Path, out: Path, tokenizer: Path) -> list:
    return [pretokenize_pretrain_data.main, "--data_dir", str(data), "--out_dir", str(out),
            "--tokenizer_dir", str(tokenizer), "--num_workers", "0"]


def chat(kind: str, tmp: Path, data: Path, out: Path, tokenizer: Path) -> list:
    return [functools.partial(pretokenize_chat.main, kind), "--data_dir", str(data),
            "--out_dir", str(out), "--tokenizer_dir", str(tokenizer), "--num_workers", "0",
            "--max_seq_len", "64"]


TOOLS: dict[str, tuple[Callable, Callable[[int], list[dict]]]] = {
    "clean": (clean, texts), "pretrain": (pretrain, texts),
    "sft": (functools.partial(chat, "sft"), sft), "dpo": (functools.partial(chat, "dpo"), dpo)}


def run(command: list, capsys) -> tuple[int, str]:
    code = run_main(command[0], [str(arg) for arg in command[1:]])
    return code, capsys.readouterr().err


def corpus(tmp: Path, records: Callable[[int], list[dict]], folder: str = "raw") -> Path:
    write_jsonl(tmp / folder / "books.jsonl", records(1))
    write_jsonl(tmp / folder / "sub" / "more.jsonl", records(2))
    return tmp / folder


# (tool, how the folder is set up -> (data dir, out dir), what the refusal names)
def out_holds_input(tmp: Path, records) -> tuple[Path, Path]:
    write_jsonl(tmp / "c" / "wiki.jsonl", records(3))  # the user's, beside the input c/en
    return corpus(tmp, records, "c/en"), tmp / "c"


def user_file_beside(tmp: Path, records) -> tuple[Path, Path]:
    (tmp / "out").mkdir()
    (tmp / "out" / "books.json").write_text('{"mine": true}')  # pretokenize's sidecar name
    return corpus(tmp, records), tmp / "out"


def copied_ledger(tmp: Path, records, tool: str) -> tuple[Path, Path]:
    data, out = user_file_beside(tmp, records)
    (out / LEDGER).write_text(json.dumps({"format": "z2all data outputs", "version": 1,
                                          "owner": tool, "files": {}}))
    return data, out


def another_tools_output(tmp: Path, records) -> tuple[Path, Path]:
    data = corpus(tmp, records)
    (tmp / "out").mkdir()
    (tmp / "out" / LEDGER).write_text(json.dumps({"format": "z2all data outputs", "version": 1,
                                                  "owner": "some_other_tool", "files": {}}))
    return data, tmp / "out"


def inside_a_run(tmp: Path, records) -> tuple[Path, Path]:
    (tmp / "run").mkdir()
    (tmp / "run" / "z2all_run.json").write_text('{"format": "z2all run directory"}')
    return corpus(tmp, records), tmp / "run" / "data"


def inside_the_tokenizer(tmp: Path, records) -> tuple[Path, Path]:
    return corpus(tmp, records), tmp / "tokenizer"  # tokenizer_dir is an input too


TOOL_NAMES = {"clean": "clean_pretrain_data", "pretrain": "pretokenize_pretrain_data",
              "sft": "pretokenize_sft_data", "dpo": "pretokenize_dpo_data"}
CASES = [
    *[(tool, out_holds_input, "holds the input --data_dir") for tool in TOOLS],
    *[(tool, user_file_beside, "holds books.json, which") for tool in TOOLS],
    *[(tool, functools.partial(copied_ledger, tool=TOOL_NAMES[tool]), "holds books.json")
      for tool in TOOLS],
    ("pretrain", another_tools_output, "holds the output of some_other_tool"),
    ("clean", inside_a_run, "inside the z2all run directory"),
    ("sft", inside_a_run, "inside the z2all run directory"),
    ("pretrain", inside_the_tokenizer, "is the input --tokenizer_dir"),
]


@pytest.mark.parametrize("tool, setup, named", CASES,
                         ids=[f"{tool}-{getattr(setup, 'func', setup).__name__}"
                              for tool, setup, _ in CASES])
def test_a_folder_that_is_not_the_tools_own_is_refused_untouched(
        tool, setup, named, tmp_path, capsys, tiny_hf_tokenizer_dir):
    command, records = TOOLS[tool]
    tokenizer = shutil.copytree(tiny_hf_tokenizer_dir, tmp_path / "tokenizer")
    data, out = setup(tmp_path, records)
    before = snapshot(tmp_path)
    code, error = run(command(tmp_path, data, out, tokenizer), capsys)
    assert code == 2, error
    assert error.count("\n") == 1 and error.startswith("error: --out_dir ")
    assert named in error and str(out) in error
    assert snapshot(tmp_path) == before  # nothing written, not even the ledger


def test_sample_index_never_replaces_a_file_it_did_not_write(tmp_path, capsys,
                                                              tiny_hf_tokenizer_dir):
    data = corpus(tmp_path, texts)
    assert run(pretrain(tmp_path, data, tmp_path / "pretok", tiny_hf_tokenizer_dir), capsys)[0] == 0
    mine = tmp_path / "pretok" / "train_L8.ibin"
    mine.write_bytes(b"the user's")
    before = snapshot(tmp_path)
    index = [build_pretrain_sample_index_map.main, "--data_dir", tmp_path / "pretok",
             "--max_seq_len", "8"]
    code, error = run(index, capsys)
    assert code == 2 and error.count("\n") == 1 and str(mine) in error
    assert snapshot(tmp_path) == before
    mine.unlink()
    assert run(index, capsys)[0] == 0
    # its files are recorded beside the token files: a rerun of the pretokenizer accepts them
    assert run(pretrain(tmp_path, data, tmp_path / "pretok", tiny_hf_tokenizer_dir), capsys)[0] == 0
    assert (tmp_path / "pretok" / "train_L8.ibin.json").is_file()


@pytest.mark.parametrize("tool", ["clean", "pretrain", "sft"])
def test_a_rerun_removes_the_outputs_of_a_removed_input(tool, tmp_path, capsys,
                                                        tiny_hf_tokenizer_dir):
    """Before: the removed file's shard (or .bin/.idx pairs and sidecar) stayed, and the next
    step (pretokenize, the sample index, the trainer) read it as data."""
    command, records = TOOLS[tool]
    data = corpus(tmp_path, records)
    out = tmp_path / "out"
    assert run(command(tmp_path, data, out, tiny_hf_tokenizer_dir), capsys)[0] == 0
    (out / "notes").mkdir()  # an empty folder holds nothing to lose: not foreign
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert any(name.startswith("sub/more.") for name in written)
    (data / "sub" / "more.jsonl").unlink()
    code, _ = run(command(tmp_path, data, out, tiny_hf_tokenizer_dir), capsys)
    assert code == 0
    left = {p.relative_to(out).as_posix() for p in out.rglob("*")
            if p.is_file() and not p.relative_to(out).as_posix().startswith(".clean/")}
    assert not any(name.startswith("sub/") for name in left), left
    assert not (out / "sub").exists()
    assert any(name.startswith("books.") for name in left)
    if tool == "clean":  # the next step reads only what is left
        pretok = tmp_path / "pretok"
        assert run(pretrain(tmp_path, out, pretok, tiny_hf_tokenizer_dir), capsys)[0] == 0
        assert sorted(p.name for p in pretok.glob("*.bin")) == ["books.bin"]


def test_a_guests_files_are_written_beside_and_never_removed(tmp_path, capsys):
    """The demo's bilingual lessons sit in the clean stage's output folder, listed there by
    data/build_demo_corpus.py as a guest's: clean writes beside them, a rerun keeps them, and
    an input that would write over one is refused."""
    data = corpus(tmp_path, texts)
    out = tmp_path / "out"
    write_jsonl(out / "lessons.jsonl", texts(9))
    OutputLedger.record(out, ["lessons.jsonl"], "build_demo_corpus")
    guest = (out / "lessons.jsonl").read_bytes()
    assert run(clean(tmp_path, data, out, tmp_path), capsys)[0] == 0
    (data / "sub" / "more.jsonl").unlink()
    assert run(clean(tmp_path, data, out, tmp_path), capsys)[0] == 0
    assert (out / "lessons.jsonl").read_bytes() == guest and (out / "books.jsonl").is_file()
    write_jsonl(data / "lessons.jsonl", texts(4))
    code, error = run(clean(tmp_path, data, out, tmp_path), capsys)
    assert code == 2 and "lessons.jsonl was written by build_demo_corpus" in error
    assert (out / "lessons.jsonl").read_bytes() == guest
